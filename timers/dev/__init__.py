"""Dev tools: the embedded server (`timers server`, the tests), the demo and its tasks.
"""
