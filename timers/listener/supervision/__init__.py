"""Supervision: a listener in the foreground of its process, N of them under a supervisor,
recycled when their tasks leak, and stopped when their supervisor dies."""
