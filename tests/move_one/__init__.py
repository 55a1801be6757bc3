"""The tasks package of the app that keeps its prefix in the ``timers move`` test under load
(:mod:`tests.integration.test_move_under_load`): it runs ``own.mark`` only."""
