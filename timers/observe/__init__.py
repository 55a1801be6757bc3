"""Seeing timers at work: a snapshot of a keyspace, Prometheus metrics of listeners and of
the keyspace. The metrics need ``pip install 'redis-timers[metrics]'`` (prometheus_client)."""
