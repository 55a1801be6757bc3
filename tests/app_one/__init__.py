"""One app's tasks package, for the tests of two apps sharing a prefix (its listener runs
``billing.charge`` only). Each run is recorded as ``[tag, "app_one", time]``
(:mod:`tests.task_pkg`)."""
