"""The other app's tasks package, for the tests of two apps sharing a prefix (its listener
runs ``mailing.send`` only). Each run is recorded as ``[tag, "app_two", time]``."""
