"""Calling a task: which code a timer may run, the context it reads, and the threads and
loop that call it."""
