"""How a listener runs task code it does not trust to behave (issue 9 rows 5, 8, 9).

- plain tasks past their timeout: the deadline starts when a thread takes the task, a
  stuck thread keeps its slot, every start is recorded once;
- an ``async def`` task that blocks the event loop: leases are still renewed (no timer runs
  twice) and a warning names the task;
- imports: the whole tasks package before the first claim, nothing at run time, and a
  listener whose package cannot be imported refuses to start and claims nothing.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import timers.listener.lanes
from tests.conftest import wait_until
from tests.integration.helpers import (
    KEYS,
    TIMERS_COMMAND,
    ListenerThread,
    run_cli,
    run_counts,
    runs,
    settled,
    started,
    subprocess_env,
)
from tests.retry_tasks import calls, done
from tests.retry_tasks.slow import TIMEOUT
from tests.slow_import_tasks import IMPORTED
from timers import Listener, TasksUnavailable, Timers

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


# -- row 5: plain tasks past their timeout ----------------------------------------------


def test_plain_tasks_past_their_timeout_keep_their_slots_and_delay_no_timeout(
        timers_client: Timers, r: redis.Redis, start_listener: Callable[..., ListenerThread],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """2 slots; 2 "hogs" run 1 s against a 0.3 s timeout (one retry); 4 brief timers
    (0.02 s, same timeout and retry) come due behind them. The hogs' threads keep their
    slots, so the brief timers wait unclaimed instead of queueing for a thread: each runs
    once and succeeds, none is recorded as timed out without having started."""
    monkeypatch.setattr(timers.listener.lanes, "HEARTBEAT_INTERVAL", 0.1)
    caplog.set_level(logging.WARNING, logger="timers")
    listener = start_listener(tasks="tests.retry_tasks", concurrency=2)
    hogs, briefs = ["hog0", "hog1"], [f"brief{i}" for i in range(4)]
    timers_client.schedule_many(
        [timers.TimerSpec("slow.overrun_retried", [tag], in_=0, id=tag) for tag in hogs]
        + [timers.TimerSpec("slow.brief", [tag], in_=0.1, id=tag) for tag in briefs])
    wait_until(lambda: any(info.get("stuck", 0) >= 1 for info in timers_client.listeners()),
               10, message="the heartbeat to report a thread stuck past its timeout")
    wait_until(lambda: len(done(r)) == 8 and settled(timers_client), 20,
               message="every thread to return and nothing left to run")

    assert Counter(tag for tag, _ in calls(r)) == {**dict.fromkeys(hogs, 2),
                                                   **dict.fromkeys(briefs, 1)}
    assert Counter(tag for tag, _ in done(r)) == {**dict.fromkeys(hogs, 2),
                                                  **dict.fromkeys(briefs, 1)}
    outcomes = Counter((f.timer_id, f.attempt, f.outcome.kind) for f in listener.reports())
    assert outcomes == {**{(tag, n, "error"): 1 for tag in hogs for n in (1, 2)},
                        **{(tag, 1, "ok"): 1 for tag in briefs}}
    failures = {f.timer_id: f.data for f in timers_client.failed()}
    assert {tid: (d["error_type"], d["attempts"]) for tid, d in failures.items()} == {
        tag: ("TimeoutError", 2) for tag in hogs}, "only the hogs are dead"
    assert f"within {TIMEOUT} s" in str(failures["hog0"]["message"])
    counters = timers_client.stats().counters
    assert (counters.get("retried"), counters.get("failed"), counters.get("fired")) == (
        2, 2, 4)
    assert any("stuck past their timeout" in m for m in caplog.messages)


# -- row 8: an async task that blocks the event loop -------------------------------------


def test_a_task_blocking_the_event_loop_keeps_its_leases_and_is_named(
        timers_client: Timers, r: redis.Redis, start_listener: Callable[..., ListenerThread],
        caplog: pytest.LogCaptureFixture) -> None:
    """Listener A claims 3 timers whose task blocks its loop 1.1 s each (3.3 s, over 10
    leases of 0.3 s); listener B is free all along and recovers any lapsed lease. Each
    timer still starts exactly once, and A says which task blocked its loop."""
    caplog.set_level(logging.WARNING, logger="timers")
    tags = [f"blocker{i}" for i in range(3)]
    timers_client.schedule_many([timers.TimerSpec("blocking.block_loop", [tag, 1.1], in_=0,
                                                  id=tag) for tag in tags])
    start_listener(lease=0.3, concurrency=3)  # A
    wait_until(lambda: started(r), 10, message="listener A to start a blocking task")
    start_listener(lease=0.3, concurrency=3)  # B
    wait_until(lambda: len(runs(r)) == 3 and settled(timers_client), 20,
               message="the 3 blocking timers to finish")

    assert Counter(started(r)) == dict.fromkeys(tags, 1), "each timer started exactly once"
    assert run_counts(r) == dict.fromkeys(tags, 1)
    counters = timers_client.stats().counters
    assert (counters.get("fired"), counters.get("reruns", 0)) == (3, 0), \
        "no lease lapsed: nothing claimed a second time"
    blocked = [m for m in caplog.messages if "event loop blocked" in m]
    assert blocked, "a warning about the blocked loop"
    assert "tests.task_pkg.blocking.block_loop" in blocked[0]
    assert not [m for m in caplog.messages if "lapsed" in m], "no lease lapsed"


# -- row 9: imports ------------------------------------------------------------------------


def test_the_tasks_package_is_imported_before_the_first_claim(
        timers_client: Timers, r: redis.Redis,
        start_listener: Callable[..., ListenerThread]) -> None:
    """A module that takes a second to import holds up no timer: it is imported before the
    listener claims anything (all 4 due timers still in the due index when it is done)."""
    specs = [timers.TimerSpec("quick.hit", [f"q{i}"], in_=0) for i in range(3)]
    specs.append(timers.TimerSpec("heavy.work", ["h"], in_=0))
    timers_client.schedule_many(specs)
    start_listener(tasks="tests.slow_import_tasks")
    wait_until(lambda: len(runs(r)) == 4 and settled(timers_client), 10,
               message="the 4 timers to run")
    assert [int(n) for n in r.lrange(IMPORTED, 0, -1)] == [4], \
        "imported once, before any of the 4 due timers was claimed"
    assert run_counts(r) == {"q0": 1, "q1": 1, "q2": 1, "h": 1}


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    (root / name).mkdir()
    for module, text in modules.items():
        (root / name / f"{module}.py").write_text(text)


def test_a_forged_event_naming_a_module_not_loaded_imports_nothing(
        timers_client: Timers, r: redis.Redis, tmp_path: Path,
        start_listener: Callable[..., ListenerThread]) -> None:
    """A module added to the package after start-up, and one beside the package, are
    refused when a forged expired event names them: neither is imported."""
    package = f"forged_{uuid.uuid4().hex[:8]}"
    side_effect = tmp_path / "imported.txt"
    _package(tmp_path, package, {"__init__": "", "ok": "def hit() -> None:\n    pass\n"})
    listener = start_listener(tasks=package, search_path=str(tmp_path))
    planted = f"open({str(side_effect)!r}, 'a').write(__name__)\ndef fn() -> None:\n    pass\n"
    (tmp_path / package / "late.py").write_text(planted)
    (tmp_path / "outside.py").write_text(planted)

    for i, task in enumerate(["late.fn", "outside.fn", "ok.hit"]):
        r.publish(KEYS.expired_channel(0), f"timers:forged{i}:{task}:[]")
    wait_until(lambda: timers_client.stats().counters.get("rejected") == 2, 10,
               message="the two forged keys naming unloaded modules to be rejected")

    assert not side_effect.exists(), "no module was imported"
    assert f"{package}.late" not in sys.modules and "outside" not in sys.modules
    assert f"{package}.outside" not in sys.modules
    assert listener.error is None and listener.reports() == []


def test_a_module_that_failed_to_import_at_start_up_is_refused_with_its_error(
        timers_client: Timers, tmp_path: Path,
        start_listener: Callable[..., ListenerThread]) -> None:
    package = f"halfbroken_{uuid.uuid4().hex[:8]}"
    _package(tmp_path, package, {"__init__": "", "bad": "raise RuntimeError('no config')\n"})
    start_listener(tasks=package, search_path=str(tmp_path))
    timers_client.schedule("bad.fn", [], in_=0, id="bad")
    wait_until(lambda: timers_client.failed() and settled(timers_client), 10,
               message="the timer to be refused")
    (failure,) = timers_client.failed()
    assert failure.data["kind"] == "refused"
    assert "RuntimeError: no config" in str(failure.data["message"])


# -- invariant 9: no tasks package, no listener --------------------------------------------


def _pending_due_timer(t: Timers) -> None:
    t.schedule("reminders.sms", [1], in_=0, id="waiting")


def _still_pending(t: Timers) -> bool:
    stats = t.stats()
    return (stats.pending, stats.running, stats.counters.get("fired", 0)) == (1, 0, 0)


def _listen(cwd: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env()
    env.pop("PYTHONPATH", None)  # the repo's own tasks/ must not be found
    return subprocess.run([TIMERS_COMMAND, "listen", "--url", url, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("case", ["missing package", "__init__ raises", "no tasks/ here",
                                  "missing package, 2 processes"])
def test_listen_refuses_to_start_without_its_tasks_package(
        case: str, redis_url: str, timers_client: Timers, tmp_path: Path) -> None:
    _pending_due_timer(timers_client)
    if case == "missing package":
        result = run_cli("listen", "--url", redis_url, "--tasks", "nosuchpkg")
        named, error = "nosuchpkg", "No module named 'nosuchpkg'"
    elif case == "missing package, 2 processes":
        result = run_cli("listen", "--url", redis_url, "--tasks", "nosuchpkg", "-p", "2")
        named, error = "nosuchpkg", "No module named 'nosuchpkg'"
    elif case == "__init__ raises":
        _package(tmp_path, "badpkg", {"__init__": "raise RuntimeError('boom at import')\n"})
        result = _listen(tmp_path, redis_url, "--tasks", "badpkg")
        named, error = "badpkg", "RuntimeError: boom at import"
    else:
        result = _listen(tmp_path, redis_url)
        named, error = "'tasks'", "No module named 'tasks'"
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0] and error in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert _still_pending(timers_client), "nothing claimed"


def test_listener_run_raises_when_its_tasks_package_cannot_be_imported(
        redis_url: str, timers_client: Timers) -> None:
    _pending_due_timer(timers_client)
    with pytest.raises(TasksUnavailable, match="'nosuchpkg' cannot be imported"):
        asyncio.run(Listener(redis_url, tasks="nosuchpkg").run(burst=True))
    assert _still_pending(timers_client)
    assert timers_client.listeners() == []


def test_registered_tasks_still_run(redis_url: str, timers_client: Timers) -> None:
    seen: list[str] = []
    timers_client.schedule("ping", ["x"], in_=0)
    asyncio.run(Listener(redis_url, registry={"ping": seen.append}).run(burst=True))
    assert seen == ["x"]
