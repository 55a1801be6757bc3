"""Sans-I/O operations: each producer and admin operation is a generator that yields one round trip
and reads its reply (schedule, cancel, failures, recurrences, moves, fleet and flow views,
snapshots, browsing, shards and the per-shard API). Imports the store and the model; sends
nothing itself.
"""
