"""The store: the Lua scripts and their typed wrappers, connections (URLs, Cluster, Sentinel, the
listener's client), server errors, server checks (eviction policy, ACL permissions, `timers
check`). Imports only the model.
"""
