"""A tasks package with a module that takes a while to import (see :mod:`.heavy`)."""

IMPORTED = "test:imported"
"""List: what :mod:`.heavy` records at the end of its import."""
