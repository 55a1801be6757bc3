"""The tasks package of the app whose timers ``timers move`` takes to their own prefix
(:mod:`tests.integration.test_move_under_load`): it runs ``mail.mark`` only."""
