"""Benchmarks for timers: ``python -m bench [--quick] [--server PATH] [--only NAME]``.

Each scenario is a module with ``run(ctx)``; :mod:`bench.common` holds the server, the
listener child processes (:mod:`bench.listener`), deadlines and the result table. These are
figures to read, never tests: nothing here is collected by pytest.
"""
