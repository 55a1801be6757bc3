"""The stored model: key layout, wire vocabulary, records and their codecs, due times, task policy,
flow and recurrence definitions. Pure: no I/O, no Redis client; imports only timers.exceptions
and the standard library (and croniter).
"""
