"""The Python API reference (docs/reference/*.md, rendered by mkdocstrings from the
docstrings) names every public name of ``timers``: a name added to ``__all__`` without a
``::: module.Name`` line (or its module's) fails here, and a line whose name the code no
longer has fails ``mkdocs build --strict``. The examples of the docstrings it renders (fenced
``python`` blocks) run here too, against an in-memory server."""

from __future__ import annotations

import doctest
import importlib
import inspect
import re
import textwrap
import types
from typing import Any

import pytest

import timers
import timers.aio
from tests.docs_blocks import run_python
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
    """A class shows its methods; a module-level function made from a client method
    (``timers.producer.forward``) is shown by that method."""
    shown = {id(resolve(path)) for path in directives()}
    shown |= {id(member) for path in directives() if inspect.isclass(cls := resolve(path))
              for member in vars(cls).values()}
    missing = [name for name in timers.__all__
               if id(getattr(getattr(timers, name), "__wrapped__", getattr(timers, name)))
               not in shown
               and not (hasattr(exceptions, name) and id(exceptions) in shown)]
    assert missing == []


@pytest.mark.parametrize("module", [timers, timers.aio], ids=["timers", "timers.aio"])
def test_the_module_level_functions_link_their_methods(module: types.ModuleType) -> None:
    """Each function made from a client method links that method, where the page says what
    the functions are (mkdocs --strict checks that the link leads somewhere)."""
    page = (REFERENCE / "api.md").read_text()
    made = [getattr(module, name).__wrapped__ for name in module.__all__
            if hasattr(getattr(module, name), "__wrapped__")]
    assert made, "the module's functions are made from client methods"
    missing = [method.__qualname__ for method in made
               if f"][{method.__module__}.{method.__qualname__}]" not in page]
    assert missing == []


def test_the_testing_helpers_are_in_the_reference() -> None:
    shown = directives()
    assert {"timers.testing.TimersTest", "timers.testing.timer_context",
            "timers.pytest_plugin.timers_test"} <= shown


def rendered_modules() -> list[types.ModuleType]:
    """The modules whose docstrings the reference pages render (in part or whole)."""
    found = {}
    for path in directives():
        value = resolve(path)
        module = value if inspect.ismodule(value) else inspect.getmodule(value)
        assert module is not None, path
        found[module.__name__] = module
    return [found[name] for name in sorted(found)]


class FencedPython(doctest.DocTestParser):
    """Each fenced ``python`` block of a docstring is one example (the docs renderer shows
    it as a code block; a ``>>>`` prompt would render as a quote)."""

    def parse(self, string: str, name: str = "<string>") -> list[str | doctest.Example]:
        return [doctest.Example(block, "") for block in FENCED.findall(string)]


FENCED = re.compile(r"^[ \t]*```python\n(.*?)^[ \t]*```$", re.M | re.S)


def docstring_examples() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(parser=FencedPython(), exclude_empty=True)
    tests = [test for module in rendered_modules() for test in finder.find(module)]
    return [test for test in tests if test.examples]


def test_the_rendered_docstrings_show_examples() -> None:
    names = {test.name for test in docstring_examples()}
    assert {"timers", "timers.aio", "timers.model.policy"} <= names


@pytest.mark.parametrize("test", [pytest.param(t, id=t.name) for t in docstring_examples()])
def test_a_docstring_s_examples_run(test: doctest.DocTest,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example in turn, in one namespace that has ``timers`` (as a reader's would)."""
    from timers.testing import TimersTest

    monkeypatch.setenv("TIMERS_REDIS_URL", "redis://nowhere.invalid:1/0")
    namespace = {"__name__": test.name, "timers": timers}
    with TimersTest("tasks", search_path=str(ROOT)):
        for example in test.examples:
            run_python(textwrap.dedent(example.source), test.name, namespace)
