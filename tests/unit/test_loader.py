"""Which code a task path may run: functions defined in the tasks package, or registered."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.unit.conftest import ROOT, SAMPLE_TASKS
from tests.unit.sample_tasks import IMPORT_ATTEMPTS, mod, top_level
from timers.exceptions import TaskRefused, TasksUnavailable
from timers.listener.calling.loader import SETUP_ENV, TaskLoader, check_setup


@pytest.fixture
def loader() -> TaskLoader:
    return TaskLoader(SAMPLE_TASKS, search_path=str(ROOT))


def test_resolves_functions_defined_in_the_package(loader: TaskLoader) -> None:
    assert loader.resolve("mod.add") is mod.add
    assert loader.resolve("mod.async_add") is mod.async_add
    assert loader.resolve("top_level") is top_level
    assert loader.resolve("mod.add") is loader.resolve("mod.add")


@pytest.mark.parametrize(
    ("task", "reason"),
    [
        ("mod.system", "outside the tasks package"),  # `from os import system`
        ("mod.Thing", "not a function"),
        ("mod.json", "not a function"),  # an imported module
        ("mod.VALUE", "not a function"),
        ("mod.missing", "no function 'missing'"),
        ("nope.fn", "no module"),
        ("os.system", "no module"),
        ("builtins.eval", "no module"),
        ("mod.json.dumps", "no module"),
        ("mod.system.x", "no module"),
        ("__import__", "not a dotted path"),
        ("mod.__init__", "not a dotted path"),
        ("mod.__class__", "not a dotted path"),
        ("..", "not a dotted path"),
        ("mod..add", "not a dotted path"),
        (".mod.add", "not a dotted path"),
        ("mod._private", "not a dotted path"),
        ("_mod.add", "not a dotted path"),
        ("1mod.add", "not a dotted path"),
        ("mod/add", "not a dotted path"),
        ("", "not a dotted path"),
    ],
)
def test_refuses_everything_else_with_a_reason(
    loader: TaskLoader, task: str, reason: str
) -> None:
    with pytest.raises(TaskRefused, match=reason):
        loader.resolve(task)


def test_refusing_a_path_outside_the_package_imports_nothing(loader: TaskLoader) -> None:
    before = set(sys.modules)
    for task in ("os.system", "builtins.eval", "subprocess.run", "mod.json.dumps"):
        with pytest.raises(TaskRefused):
            loader.resolve(task)
    new = set(sys.modules) - before
    assert not {m for m in new if not m.startswith(SAMPLE_TASKS + ".")}
    assert "subprocess" not in new


def test_a_module_that_fails_to_import_is_refused_with_the_error(loader: TaskLoader) -> None:
    with pytest.raises(TaskRefused, match="RuntimeError: broken on purpose"):
        loader.resolve("broken.anything")


def test_refusals_are_cached_so_a_flood_costs_no_imports(loader: TaskLoader) -> None:
    name = SAMPLE_TASKS + ".broken"
    start = IMPORT_ATTEMPTS.get(name, 0)
    reasons = set()
    for _ in range(5):
        with pytest.raises(TaskRefused) as info:
            loader.resolve("broken.fn")
        reasons.add(str(info.value))
    assert IMPORT_ATTEMPTS[name] == start + 1
    assert len(reasons) == 1

    fresh = TaskLoader(SAMPLE_TASKS, search_path=str(ROOT))
    with pytest.raises(TaskRefused):
        fresh.resolve("broken.fn")
    assert IMPORT_ATTEMPTS[name] == start + 2  # a cache per loader, not a global one


def test_registry_names_resolve_even_outside_the_package() -> None:
    def ping() -> str:
        return "pong"

    loader = TaskLoader(SAMPLE_TASKS, registry={"ops.ping": ping, "mod.add": ping},
                        search_path=str(ROOT))
    assert loader.resolve("ops.ping") is ping
    assert loader.resolve("mod.add") is ping  # an explicit registration wins
    with pytest.raises(TaskRefused):
        loader.resolve("ops.other")


def test_a_package_that_does_not_exist_refuses_every_task() -> None:
    loader = TaskLoader("no_such_tasks_pkg", search_path=str(ROOT))
    with pytest.raises(TaskRefused, match="no module"):
        loader.resolve("reminders.sms")


@pytest.mark.parametrize("package", ["", "..", "a..b", "_private", "pkg/mod"])
def test_the_package_name_must_be_a_dotted_name(package: str) -> None:
    with pytest.raises(ValueError, match="dotted module name"):
        TaskLoader(package)


def test_a_setup_function_runs_once_before_the_tasks_package_is_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``timers listen --setup mod:fn`` ($TIMERS_SETUP): e.g. django.setup() for tasks
    that import models at their top."""
    (tmp_path / "setup_mod_once.py").write_text(
        "import os\nCALLS = []\ndef setup():\n    CALLS.append(1)\n"
        "    os.environ['SETUP_RAN'] = '1'\n")
    pkg = tmp_path / "needs_setup"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "jobs.py").write_text(
        "import os\nassert os.environ.get('SETUP_RAN') == '1', 'setup first'\n"
        "def go():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(SETUP_ENV, "setup_mod_once:setup")
    monkeypatch.delenv("SETUP_RAN", raising=False)
    loader = TaskLoader("needs_setup")
    loader.load()
    assert loader.resolve("jobs.go")() == 1
    TaskLoader("needs_setup").load()  # a second loader in the process: not called again
    import setup_mod_once  # type: ignore[import-not-found]

    assert setup_mod_once.CALLS == [1]


@pytest.mark.parametrize("spec", ["nocolon", "a.b:", ":fn", "a..b:fn", "a:b.c", "a:1x"])
def test_a_setup_spec_that_does_not_read_is_refused_in_one_line(spec: str) -> None:
    with pytest.raises(ValueError, match=r"must look like 'package\.module:function'"):
        check_setup(spec)


def test_a_setup_that_fails_makes_the_tasks_unavailable_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "setup_mod_fails.py").write_text("def setup():\n    raise RuntimeError('no db')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(SETUP_ENV, "setup_mod_fails:setup")
    with pytest.raises(TasksUnavailable, match=r"setup 'setup_mod_fails:setup' failed: "
                                               r"RuntimeError: no db"):
        TaskLoader("tests.unit.sample_tasks").load()


def test_a_loaded_package_names_every_task_it_can_run_sorted(loader: TaskLoader) -> None:
    """What a listener announces to the others of its prefix (its heartbeat's task list):
    nothing before its package is loaded, then every task of the package, sorted (an
    empty list after the load would tell the others it runs none of them)."""
    assert loader.task_names() == ()
    loader.load()
    names = loader.task_names()
    assert "mod.add" in names and list(names) == sorted(names)
