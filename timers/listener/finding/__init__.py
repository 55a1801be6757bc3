"""Finding due timers: the events and wakes that say one is due, the due-driven sweep that
claims them, and when the next one is due."""
