"""Flow control on the listener's side: the gate asked before a run starts, parking and
placement of keyed timers, and the runs handed along a concurrency key's slot."""
