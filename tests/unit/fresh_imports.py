"""What an import loads, seen in this process rather than in a fresh interpreter (a unit test
starts no process: ``tests/unit/no_processes.py``).

:func:`fresh_modules` hides the named packages from ``sys.modules`` for the length of a
block, so importing one there runs its modules afresh and what they import shows up in
``sys.modules``; afterwards ``sys.modules`` is exactly as it was, and the fresh copies are
dropped. One difference from a fresh interpreter: a third-party module already imported
in this process is not imported again, so what it imports in turn does not show (a fresh
interpreter would show it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


def _named(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@contextmanager
def fresh_modules(*packages: str) -> Iterator[None]:
    """Within the block, ``packages`` and their submodules are not imported yet."""
    saved = dict(sys.modules)
    for name in [n for n in sys.modules if _named(n, packages)]:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.clear()
        sys.modules.update(saved)


def loaded(*packages: str) -> list[str]:
    """The modules of ``packages`` in ``sys.modules``, sorted."""
    return sorted(n for n in sys.modules if _named(n, packages))
