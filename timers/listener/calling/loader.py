"""Which code a timer may run: functions in the tasks package, or registered ones.

A task path comes out of a key name, which is data from the network. It is resolved only
as ``<package>.<module path>.<function>``: every segment a plain name that starts with a
letter (no dunders, no ``..``), the module one of the package's, and the function defined
there (not imported into it from elsewhere, as ``os.system`` would be).

The whole package is imported once, at start-up (:meth:`TaskLoader.load`): every module
whose name a task path can spell. At run time nothing is imported: an event naming a
module that is not loaded is refused, so a slow import never stalls the event loop and a
forged event cannot make a listener import anything. A module that failed to import at
start-up refuses its tasks with that import error. Refusals are cached.

Where the package is found: ``PYTHONPATH`` and installed packages first, the search path
(by default the working directory) last, so a stale copy in the working directory cannot
shadow the one deployed on ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import pkgutil
import sys
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from timers.exceptions import TaskRefused, TasksUnavailable
from timers.listener.defaults import DEFAULT_PACKAGE, SETUP_ENV, TASKS_ENV
from timers.model.encoding import is_task_path
from timers.model.policy import policy_of

log = logging.getLogger("timers.listener")

_MAX_CACHED_REFUSALS = 10_000
_set_up: set[str] = set()
"""The setup functions this process has called already."""


def check_setup(spec: str) -> tuple[str, str]:
    """(module, function) of a ``module:function`` setup spec, or ValueError saying why not."""
    module, _, function = spec.partition(":")
    if not (module and function and all(is_task_path(part) for part in module.split("."))
            and function.isidentifier()):
        raise ValueError(f"setup {spec!r} must look like 'package.module:function'")
    return module, function


def run_setup(spec: str) -> None:
    """Call the setup function ``spec`` (``module:function``), once per process; raises
    :class:`TasksUnavailable` saying what failed."""
    if spec in _set_up:
        return
    try:
        module_name, function = check_setup(spec)
        setup = getattr(importlib.import_module(module_name), function, None)
        if not callable(setup):
            raise TypeError(f"{module_name} has no function {function!r}")
        setup()
    except (Exception, SystemExit) as exc:
        raise TasksUnavailable(f"setup {spec!r} failed: {_import_error(exc)}") from None
    _set_up.add(spec)


def configured_package(package: str | None = None) -> str:
    return package or os.environ.get(TASKS_ENV) or DEFAULT_PACKAGE


def search_last(path: str) -> None:
    """Make ``path`` the last place imports look, unless it is on ``sys.path`` already."""
    if path not in sys.path:
        sys.path.append(path)


def working_directory_last() -> None:
    """``python -m timers`` starts with the working directory first on ``sys.path``,
    ahead of ``PYTHONPATH``: move it to the end."""
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.append(sys.path.pop(0))


def _import_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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
        self.search_path = search_path
        if search_path is not None:
            search_last(search_path)
        self._found: dict[str, Callable[..., Any]] = {}
        self._refused: dict[str, str] = {}
        self._lock = threading.Lock()
        self._loaded = False
        self._keyed: tuple[str, ...] | None = None
        self._names: tuple[str, ...] | None = None
        self._package_error: str | None = None
        self.failed_modules: dict[str, str] = {}
        """Modules of the package that failed to import at start-up: name -> error."""

    def load(self) -> None:
        """Import the package and every module in it, once (blocking: call it off the
        event loop). Raises :class:`TasksUnavailable` if the package itself cannot be
        imported; a module that fails is kept in :attr:`failed_modules` and its tasks are
        refused with its error."""
        with self._lock:
            if not self._loaded:
                self._import_all()
                self._loaded = True
        if self._package_error is not None:
            raise TasksUnavailable(self._package_error)

    def load_at_start(self, optional: bool = False) -> None:
        """:meth:`load`, logging each module that failed; with ``optional`` (a listener
        with registered tasks and no package named), a missing package is a warning."""
        try:
            self.load()
        except TasksUnavailable as exc:
            if not optional:
                raise
            log.warning("%s: running registered tasks only", exc)
        for module, error in self.failed_modules.items():
            log.error("tasks module %s failed to import: %s; its timers will be refused",
                      module, error)

    def _import_all(self) -> None:
        setup = os.environ.get(SETUP_ENV)
        if setup:  # before the package: e.g. django.setup() for tasks that use the ORM
            try:
                run_setup(setup)
            except TasksUnavailable as exc:
                self._package_error = str(exc)
                return
        try:
            root = importlib.import_module(self.package)
        except (Exception, SystemExit) as exc:
            self._package_error = (f"tasks package {self.package!r} cannot be imported: "
                                   f"{_import_error(exc)}")
            return
        self._walk(root)

    def _walk(self, package: ModuleType) -> None:
        """Import every module under ``package`` whose name a task path can spell."""
        path = getattr(package, "__path__", None)
        if path is None:
            return  # the tasks "package" is a single module
        for info in pkgutil.iter_modules(path, package.__name__ + "."):
            if not is_task_path(info.name.rpartition(".")[2]):
                continue  # `_helpers` and the like: no task path can name them
            try:
                module = importlib.import_module(info.name)
            except (Exception, SystemExit) as exc:
                self.failed_modules[info.name] = _import_error(exc)
                continue
            if info.ispkg:
                self._walk(module)

    def _tasks_found(self, imported: bool = False) -> dict[str, Callable[..., Any]]:
        """Task path -> function: every function defined in a loaded module of the
        package (with ``imported``, also those a module imports from another module of
        the package: :meth:`resolve` runs them too), and the registered ones."""
        found = dict(self.registry)
        prefix = self.package + "."
        for name, module in list(sys.modules.items()):
            if name != self.package and not name.startswith(prefix):
                continue
            path = name[len(prefix):] if name != self.package else ""
            for attr, fn in list(vars(module).items()):
                home = getattr(fn, "__module__", None)
                if callable(fn) and not inspect.isclass(fn) and (home == name or (
                        imported and isinstance(home, str)
                        and (home == self.package or home.startswith(prefix)))):
                    found[f"{path}.{attr}" if path else attr] = fn
        return {task: fn for task, fn in found.items() if is_task_path(task)}

    def keyed_tasks(self) -> tuple[str, ...]:
        """The tasks of the loaded package (and the registered ones) with a concurrency key
        or cap, by task path: their claims are ordered per key (the order barrier,
        ``timers/store/lua/flow.lua``). Worked out once, after :meth:`load`."""
        if self._keyed is None:
            if not self._loaded:
                return ()
            self._keyed = tuple(sorted(
                task for task, fn in self._tasks_found().items()
                if policy_of(fn).concurrency is not None))
        return self._keyed

    def task_names(self) -> tuple[str, ...]:
        """Every task path this loader can run, sorted: what the listener announces to the
        others of its prefix (:mod:`timers.ops.fleet`). Empty before :meth:`load`."""
        if self._names is None:
            if not self._loaded:
                return ()
            self._names = tuple(sorted(self._tasks_found(imported=True)))
        return self._names

    def history_retention(self) -> dict[str, tuple[int | None, int | None]]:
        """Task path -> (how long the run history keeps its ended timers, ms, as its
        ``@task(history=...)`` says (None: the listener's age; 0: none); how many at most,
        as its ``@task(history_count=...)`` says (None: the listener's count only)), of
        every task this loader can run. Empty before :meth:`load`."""
        if not self._loaded:
            return {}
        out = {}
        for task, fn in self._tasks_found(imported=True).items():
            policy = policy_of(fn)
            out[task] = (policy.history_ms, policy.history_count)
        return out

    def resolve(self, task: str) -> Callable[..., Any]:
        """The callable for ``task``, or :class:`TaskRefused` saying why not. Imports
        nothing once the package is loaded."""
        found = self._found.get(task) or self.registry.get(task)
        if found is not None:
            return found
        reason = self._refused.get(task)
        if reason is None:
            try:
                fn = self._lookup(task)
            except TaskRefused as exc:
                if len(self._refused) >= _MAX_CACHED_REFUSALS:
                    self._refused.clear()
                self._refused[task] = str(exc)
                raise
            self._found[task] = fn
            return fn
        raise TaskRefused(reason)

    def _module(self, task: str, module_name: str) -> ModuleType:
        """The loaded module ``module_name`` of the package; never imports it."""
        if not self._loaded:
            with contextlib.suppress(TasksUnavailable):
                self.load()
        if self._package_error is not None:
            raise TaskRefused(f"task {task!r}: no module {module_name!r}: "
                              f"{self._package_error}")
        parts = module_name.split(".")
        for i in range(len(parts), 0, -1):
            error = self.failed_modules.get(".".join(parts[:i]))
            if error is not None:
                raise TaskRefused(f"task {task!r}: importing {'.'.join(parts[:i])!r} failed "
                                  f"at start-up: {error}")
        module = sys.modules.get(module_name)
        if module is None:
            raise TaskRefused(f"task {task!r}: no module {module_name!r} in the tasks "
                              f"package (modules are imported at start-up only)")
        return module

    def _lookup(self, task: str) -> Callable[..., Any]:
        if not is_task_path(task):
            raise TaskRefused(f"{task[:100]!r} is not a dotted path of plain names")
        module_path, _, name = task.rpartition(".")
        module_name = f"{self.package}.{module_path}" if module_path else self.package
        module = self._module(task, module_name)
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
