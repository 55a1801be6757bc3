"""timers: delayed timers on Redis, fired once, on time, by whichever listener is alive."""
