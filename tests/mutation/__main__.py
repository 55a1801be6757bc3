"""``python -m tests.mutation``: plant each bug of :mod:`tests.mutation.bugs`, one at a time,
in a scratch copy of the tree, run the tests, demand that they fail, and print a table.

The working tree is never written: the tree is copied once per worker into a temporary
directory (no ``.git``, no ``.venv``), each bug is written into that copy's file and the
file is restored in a ``finally``. The tests run with this interpreter, from the copy
(``PYTHONPATH`` first: the copy's ``timers`` and ``tests`` are the ones imported, which is
checked before anything runs).

The tests, in two stages (the first failure ends a bug's run):

1. ``model``: the model test's default run (``tests/unit/test_model_flow.py -m 'not
   model_long'``: its scenarios, then its random histories) without shrinking, with a fixed
   hypothesis seed (``--seed``) so that two runs agree;
2. ``unit``: the unit tests next to what the bugs touch (:data:`NEIGHBOURS`), or with
   ``--full`` every unit test (``tests/unit``).

A bug no stage catches is SURVIVED; the command exits 1 if any did, but for a bug the
list says survives (``Bug.survives``: why), printed as such; one of those caught is said so
(its note is then stale).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.bugs import BUGS, Bug
from tests.mutation.sampled import sample

ROOT = Path(__file__).resolve().parents[2]
IGNORED = shutil.ignore_patterns(".git", ".venv", "site", "__pycache__", ".hypothesis",
                                 ".mypy_cache", ".ruff_cache", ".pytest_cache", "*.egg-info")
MODEL = ["tests/unit/test_model_flow.py", "-m", "not model_long"]
NEIGHBOURS = [
    "tests/unit/test_flow_declared.py", "tests/unit/test_flow_lua.py",
    "tests/unit/test_flow_names.py", "tests/unit/test_flow_next_in_line.py",
    "tests/unit/test_flow_park.py", "tests/unit/test_flow_rates.py",
    "tests/unit/test_flow_schedule.py", "tests/unit/test_flow_views.py",
    "tests/unit/test_claim_scripts.py", "tests/unit/test_placement.py",
    "tests/unit/test_shards.py", "tests/unit/test_fencing.py",
    "tests/unit/test_next_in_line_runs.py", "tests/unit/test_late_replies.py",
    "tests/unit/test_parker.py", "tests/unit/test_crashes.py",
    "tests/unit/test_listener_unit.py", "tests/unit/test_listener_parts.py",
    "tests/unit/test_task_execution_unit.py", "tests/unit/test_runs.py",
    "tests/unit/test_schedule_batch.py", "tests/unit/test_move.py",
    "tests/unit/test_journal.py", "tests/unit/test_journal_listener.py",
    "tests/unit/test_speed_switch.py", "tests/unit/test_retry.py",
    "tests/unit/test_data_format.py", "tests/unit/test_flow_plan.py",
    "tests/unit/test_supervisor.py", "tests/unit/test_history_trim.py",
    "tests/unit/test_recycling.py", "tests/unit/test_failure_records.py",
    "tests/unit/test_declare.py", "tests/unit/test_group_disagreement.py",
    "tests/unit/test_lanes.py", "tests/unit/test_due_tracker.py",
    "tests/unit/test_fleet.py", "tests/unit/test_cron_hook.py", "tests/unit/test_context.py",
    "tests/unit/test_scripts_all_or_nothing.py", "tests/unit/test_history.py",
    "tests/unit/test_coalesce.py", "tests/unit/test_cli_edges.py",
    "tests/unit/test_cli_usage.py", "tests/unit/test_check.py", "tests/unit/test_web_reads.py",
]
"""The unit tests of the scripts, the flow control, the fence, the executor, the
endings journal, the speed layer's switch, the listener's way back to Redis, the data
format checks, the supervisor, its recycling, the history's upkeep, the failure records,
the declared keys, the task groups' endings, the lanes' events, the Redis clock's
estimate, the hand-back for a peer that has the task, a recurrence's steps, the
context a task sees, a timer's status, the asyncio producer's batches, and what the
command line and the dashboard show."""
STAGE_TIMEOUT = 900.0
SAMPLED_FILES = "timers/store/lua/*.lua,timers/listener/**/*.py"
"""Where ``--sample`` draws its bugs by default: the scripts and the listener."""


@dataclass
class Result:
    bug: Bug
    caught_by: str
    """The first failing test (``stage: node id``), or "" (SURVIVED)."""
    seconds: float


class Scratch:
    """A copy of the tree in a temporary directory, one bug planted at a time."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="timers-mutation-"))
        self.root = self.dir / "tree"
        shutil.copytree(ROOT, self.root, ignore=IGNORED)

    def env(self, seed: int) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.root) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # a planted file is never read from a stale pyc
        env["TIMERS_MODEL_NO_SHRINK"] = "1"
        return env

    def check_imports(self) -> None:
        """The copy's ``timers`` and ``tests`` are the ones the tests import."""
        out = subprocess.run(
            [sys.executable, "-c", "import timers, tests; print(timers.__file__); "
             "print(tests.__file__)"], cwd=self.root, env=self.env(0), capture_output=True,
            text=True, check=True).stdout.split()
        if not all(Path(p).resolve().is_relative_to(self.root.resolve()) for p in out):
            raise SystemExit(f"the scratch copy is not what the tests import: {out}")

    def run(self, bug: Bug | None, stages: list[tuple[str, list[str]]], seed: int) -> str:
        """Plant ``bug`` (None: none), run the stages; the first failing test, or ""."""
        target = self.root / bug.path if bug else None
        original = target.read_text() if target else ""
        try:
            if bug and target:
                if original.count(bug.original) != 1:
                    return f"(not planted: its snippet occurs {original.count(bug.original)} times)"
                target.write_text(original.replace(bug.original, bug.replacement))
            for stage, args in stages:
                failed = self._pytest(args, seed)
                if failed:
                    return f"{stage}: {failed}"
            return ""
        finally:
            if target:
                target.write_text(original)

    def _pytest(self, args: list[str], seed: int) -> str:
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:randomly",
                   "-p", "no:cacheprovider", f"--hypothesis-seed={seed}", *args]
        try:
            done = subprocess.run(command, cwd=self.root, env=self.env(seed),
                                  capture_output=True, text=True, timeout=STAGE_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"(timed out after {STAGE_TIMEOUT:.0f} s)"
        if done.returncode == 0:
            return ""
        found = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
        if found:
            return found[0]
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["?"]
        return f"(exit {done.returncode}: {tail[0][:80]})"

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="bugs tried at once (default 2)")
    parser.add_argument("--only", default="", help="comma-separated bug names")
    parser.add_argument("--full", action="store_true",
                        help="the second stage runs every unit test (tests/unit)")
    parser.add_argument("--model-only", action="store_true", help="the model stage alone")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--list", action="store_true", help="print the bugs and exit")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="N bugs drawn at random (tests/mutation/sampled.py) instead of "
                             "the list's; with --full, every unit test looks for them")
    parser.add_argument("--draw", type=int, default=1, help="the draw's seed (default 1)")
    parser.add_argument("--files", default=SAMPLED_FILES,
                        help=f"globs of the files bugs are drawn in, comma-separated "
                             f"(default {SAMPLED_FILES})")
    options = parser.parse_args(argv)
    if options.sample:
        paths = sorted({str(f.relative_to(ROOT)) for pattern in options.files.split(",")
                        for f in ROOT.glob(pattern)})
        bugs = sample(ROOT, paths, options.sample, options.draw)
    else:
        bugs = [b for b in BUGS if not options.only or b.name in options.only.split(",")]
    if options.list:
        for bug in bugs:
            print(f"{bug.name:28} {bug.path:34} {bug.breaks}")
        return 0
    stages = [("model", MODEL)]
    if not options.model_only:
        stages.append(("unit", ["tests/unit", "-m", "not integration"] if options.full
                       else NEIGHBOURS))
    started = time.perf_counter()
    scratches: list[Scratch] = []
    free: list[Scratch] = []
    lock = threading.Lock()

    def scratch() -> Scratch:
        with lock:
            if free:
                return free.pop()
        made = Scratch()
        made.check_imports()
        with lock:
            scratches.append(made)
        return made

    def attempt(bug: Bug | None) -> Result:
        space = scratch()
        began = time.perf_counter()
        try:
            caught = space.run(bug, stages, options.seed)
        finally:
            with lock:
                free.append(space)
        return Result(bug or BUGS[0], caught, time.perf_counter() - began)

    try:
        baseline = attempt(None)
        state = f"FAILS: {baseline.caught_by}" if baseline.caught_by else "passes"
        print(f"unplanted tree: {state} ({baseline.seconds:.0f} s)", flush=True)
        if baseline.caught_by:
            return 2
        with ThreadPoolExecutor(max(options.jobs, 1)) as pool:
            results = []
            for result in pool.map(attempt, bugs):
                results.append(result)
                print(f"{result.bug.name:28} {result.seconds:6.0f} s  {verdict(result)}",
                      flush=True)
    finally:
        for space in scratches:
            space.remove()
    survived = [r for r in results if not r.caught_by]
    print()
    print("| bug | file | breaks | caught by | s |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r.bug.name} | {r.bug.path} | {r.bug.breaks} | {verdict(r)} | "
              f"{r.seconds:.0f} |")
    print(f"\n{len(results) - len(survived)} of {len(results)} caught "
          f"({sum(r.caught_by.startswith('model') for r in results)} by the model test), "
          f"{sum(bool(r.bug.survives) for r in survived)} survived as the list says; "
          f"{time.perf_counter() - started:.0f} s in all")
    return 1 if any(not r.bug.survives for r in survived) else 0


def verdict(result: Result) -> str:
    """What became of a bug: the test that caught it, or SURVIVED."""
    if result.caught_by:
        stale = " (listed as surviving: drop its note)" if result.bug.survives else ""
        return result.caught_by + stale
    if result.bug.survives:
        return f"SURVIVED, as the list says: {result.bug.survives}"
    return "**SURVIVED**"


if __name__ == "__main__":
    sys.exit(main())
