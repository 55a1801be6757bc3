"""Process tuning: the garbage collector's settings (off with ``TIMERS_SPEED_OFF``, see
:mod:`timers.speed`), the event loop (asyncio's or uvloop's), and sub-millisecond waits."""
