"""Quarantine: suspect runs run in a child process forked from a server with the tasks
imported, so a poison kills only itself; and when a timer is dead of crashes."""
