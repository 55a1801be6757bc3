"""The producer: the sync and asyncio clients (Timers, AsyncTimers) that carry the operations over
redis-py; coalescing; one client per event loop.
"""
