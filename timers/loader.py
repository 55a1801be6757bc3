"""Which code a timer may run: functions in the tasks package, or registered ones.

A task path comes out of a key name, which is data from the network. It is resolved only
as ``<package>.<module path>.<function>``: every segment a plain name that starts with a
letter (no dunders, no ``..``), the module imported from inside the package, and the
function defined there (not imported into it from elsewhere, as ``os.system`` would be).
Anything else is refused with a reason, and the refusal is cached so a flood of bad names
costs no imports.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from timers.encoding import is_task_path
from timers.exceptions import TaskRefused

DEFAULT_PACKAGE = "tasks"
TASKS_ENV = "TIMERS_TASKS"
_MAX_CACHED_REFUSALS = 10_000


def configured_package(package: str | None = None) -> str:
    return package or os.environ.get(TASKS_ENV) or DEFAULT_PACKAGE


class TaskLoader:
    """Resolves task paths to callables, refusing everything outside the allowed code."""

    def __init__(
        self,
        package: str = DEFAULT_PACKAGE,
        registry: Mapping[str, Callable[..., Any]] | None = None,
        search_path: str | None = None,
    ) -> None:
        if not is_task_path(package):
            raise ValueError(f"tasks package must be a dotted module name, got {package!r}")
        self.package = package
        self.registry = dict(registry or {})
        if search_path is not None and search_path not in sys.path:
            sys.path.insert(0, search_path)
        self._found: dict[str, Callable[..., Any]] = {}
        self._refused: dict[str, str] = {}

    def resolve(self, task: str) -> Callable[..., Any]:
        """The callable for ``task``, or :class:`TaskRefused` saying why not."""
        found = self._found.get(task) or self.registry.get(task)
        if found is not None:
            return found
        reason = self._refused.get(task)
        if reason is None:
            try:
                fn = self._load(task)
            except TaskRefused as exc:
                if len(self._refused) >= _MAX_CACHED_REFUSALS:
                    self._refused.clear()
                self._refused[task] = str(exc)
                raise
            self._found[task] = fn
            return fn
        raise TaskRefused(reason)

    def _load(self, task: str) -> Callable[..., Any]:
        if not is_task_path(task):
            raise TaskRefused(f"{task[:100]!r} is not a dotted path of plain names")
        module_path, _, name = task.rpartition(".")
        module_name = f"{self.package}.{module_path}" if module_path else self.package
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (
                exc.name == module_name or module_name.startswith(exc.name + ".")
            ):
                raise TaskRefused(
                    f"task {task!r}: no module {module_name!r} in the tasks package"
                ) from None
            raise TaskRefused(f"task {task!r}: importing {module_name!r} failed: {exc}") from None
        except Exception as exc:
            raise TaskRefused(
                f"task {task!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        if getattr(module, "__name__", None) != module_name:
            raise TaskRefused(f"task {task!r}: {module_name!r} is not a module of the package")
        fn = getattr(module, name, None)
        if fn is None:
            raise TaskRefused(f"task {task!r}: module {module_name!r} has no function {name!r}")
        if inspect.isclass(fn) or inspect.ismodule(fn) or not callable(fn):
            raise TaskRefused(f"task {task!r}: {name!r} is not a function")
        defined_in = getattr(fn, "__module__", None)
        if not isinstance(defined_in, str) or not (
            defined_in == self.package or defined_in.startswith(self.package + ".")
        ):
            raise TaskRefused(
                f"task {task!r}: {name!r} is defined in {defined_in!r}, outside the tasks "
                f"package {self.package!r}"
            )
        return fn  # type: ignore[no-any-return]
