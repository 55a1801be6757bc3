"""Tasks for :mod:`bench.faults` (``--tasks bench.fault_tasks``): each run writes to a ledger
file, which survives whatever the fault does to Redis."""
