"""The Python API reference (docs/reference/*.md, rendered by mkdocstrings from the
docstrings) names every public name of ``timers``: a name added to ``__all__`` without a
``::: module.Name`` line (or its module's) fails here, and a line whose name the code no
longer has fails ``mkdocs build --strict``."""

from __future__ import annotations

import importlib
import re
from typing import Any

import timers
from tests.unit.conftest import ROOT
from timers import exceptions

REFERENCE = ROOT / "docs" / "reference"


def directives() -> set[str]:
    """Each ``::: dotted.path`` of the reference pages, and each member listed under one."""
    found: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        text = page.read_text()
        for match in re.finditer(r"^::: (\S+)\n((?:    .*\n|\n)*)", text, re.M):
            path, options = match[1], match[2]
            found.add(path)
            found.update(f"{path}.{name}" for name in re.findall(r"^ +- (\w+)$", options, re.M))
    return found


def resolve(path: str) -> Any:
    """The object ``path`` names (a module, or a name in one)."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)


def test_every_public_name_is_in_the_reference() -> None:
    shown = {id(resolve(path)) for path in directives()}
    missing = [name for name in timers.__all__
               if id(getattr(timers, name)) not in shown
               and not (hasattr(exceptions, name) and id(exceptions) in shown)]
    assert missing == []


def test_the_testing_helpers_are_in_the_reference() -> None:
    shown = directives()
    assert {"timers.testing.TimersTest", "timers.testing.timer_context",
            "timers.pytest_plugin.timers_test"} <= shown
