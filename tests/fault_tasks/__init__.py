"""The task of the fault tests: ``ledger.mark`` writes each run to a file, not to Redis."""
