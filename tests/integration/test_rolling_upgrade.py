"""A rolling upgrade from the last release to this one, and back, on one prefix.

The last release is 0.1.0, commit 6d536c3: its ``timers`` and ``tasks`` packages are taken
from this checkout's git history into a folder of their own, and its listeners and its
producer run from there (first on ``PYTHONPATH``, and their working directory). This
release keeps its data format (format 1, :mod:`timers.model.data_format`), so both run
side by side while timers come due: plain ones, keyed ones (a concurrency key of limit 1)
and rate-limited ones (:mod:`tests.upgrade_tasks.jobs`), scheduled by producers of both
releases. The listeners are replaced one by one, each stopped as an upgrade stops it
(SIGTERM) once its replacement is up: old by new, then new by old; while the fleet is mixed,
a batch comes due whose rate-limited timers are a burst, run by listeners of both.

Every timer runs exactly once (none lost, none twice: each run notes its tag in a file),
runs of one key never overlap, and nothing is left pending, running, held or waiting; no
timer is dead.
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

import timers
from tests.conftest import ROOT, wait_until
from tests.integration.helpers import Processes, settled
from tests.upgrade_producer import schedule_batch
from tests.upgrade_tasks.jobs import INTERVAL_MS, LEDGER_ENV, RATE
from timers import Timers
from timers.model.keys import Keyspace

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

LAST_RELEASE = "6d536c3"
"""The commit of the last release (0.1.0)."""
LAST_VERSION = "0.1.0"
KEYS = Keyspace()
BATCH = {"plain": 20, "keyed": 12, "paced": 8}
"""The timers of each batch each producer schedules."""
DEVICES = 3
"""The concurrency keys the keyed timers share, across releases."""


@pytest.fixture(scope="module")
def last_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the last release's ``timers`` and ``tasks`` packages."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the rolling upgrade test takes the last release "
                    "from this checkout's git history")
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{LAST_RELEASE}^{{commit}}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"the last release's commit {LAST_RELEASE} is not in this tree's git history "
                    f"(an sdist, or a shallow clone): the rolling upgrade test runs from a "
                    f"git checkout that has it")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", LAST_RELEASE, "timers", "tasks"],
                             capture_output=True, check=True)
    folder = tmp_path_factory.mktemp("last-release")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


@dataclass(frozen=True)
class Release:
    """Where a release's code is: first on ``PYTHONPATH``, and the working directory of
    its processes (``python -m`` puts that first on the path)."""

    name: str
    folder: Path

    def env(self, processes: Processes, url: str, ledger: Path) -> dict[str, str]:
        env = processes.env()
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(self.folder), str(ROOT)]))
        env["TIMERS_REDIS_URL"] = url
        env[LEDGER_ENV] = str(ledger)
        return env


@dataclass
class Fleet:
    """The listeners of the test, and the producers of either release."""

    processes: Processes
    url: str
    ledger: Path
    client: Timers

    def listen(self, release: Release) -> subprocess.Popen[bytes]:
        """Start a listener of ``release`` and wait until its heartbeat is in Redis."""
        proc = self.processes.spawn(
            sys.executable, "-m", "timers", "listen", "--tasks", "tests.upgrade_tasks",
            env=release.env(self.processes, self.url, self.ledger), cwd=release.folder)
        wait_until(lambda: proc.poll() is not None or proc.pid in self.live_pids(), 30,
                   interval=0.05, message=f"a listener of {release.name} to come up")
        assert proc.poll() is None, self.processes.output(proc)
        return proc

    def live_pids(self) -> set[int]:
        return {int(info["pid"]) for info in self.client.listeners()}

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop a listener as an upgrade does (SIGTERM) and wait for it to exit."""
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        assert code == 0, self.processes.output(proc)

    def replace(self, proc: subprocess.Popen[bytes],
                release: Release) -> subprocess.Popen[bytes]:
        """A listener of ``release`` up, then ``proc`` stopped."""
        started = self.listen(release)
        self.stop(proc)
        return started

    def produce(self, label: str, old: Release, spread: float) -> list[str]:
        """A batch from each release's producer at once, due over ``spread`` seconds (the
        last release's in a process of its own, this one's here); their tags."""
        command = [sys.executable, "-m", "tests.upgrade_producer", self.url, f"{label}-old",
                   str(BATCH["plain"]), str(BATCH["keyed"]), str(BATCH["paced"]), str(spread),
                   str(DEVICES)]
        elsewhere = subprocess.Popen(command, cwd=old.folder, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE,
                                     env=old.env(self.processes, self.url, self.ledger))
        here = schedule_batch(self.url, f"{label}-new", BATCH["plain"], BATCH["keyed"],
                              BATCH["paced"], spread, DEVICES)
        out, err = elsewhere.communicate(timeout=60)
        assert elsewhere.returncode == 0, err.decode(errors="replace")
        return out.decode().split() + here

    def mixed_batch(self, label: str, old: Release) -> list[str]:
        """A batch from both producers while listeners of both releases listen, kept so
        until its paced timers (a burst, due half way) ran: a burst of a rate and the runs
        of the keys on a mixed fleet. Its tags."""
        tags = self.produce(label, old, spread=4)
        paced = [tag for tag in tags if "-paced-" in tag]
        wait_until(lambda: self.ran().issuperset(paced), 20, interval=0.05,
                   message=f"the paced timers of {label} to run on the mixed fleet")
        return tags

    def ran(self) -> set[str]:
        return {line.split()[1] for line in self.lines()}

    def drained(self, tags: list[str]) -> bool:
        """Every timer of ``tags`` ran, and nothing is pending or running."""
        return self.ran().issuperset(tags) and settled(self.client)

    def lines(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []


def leftovers(r: redis.Redis) -> dict[str, int]:
    """The entries of every index, queue and slot a timer can wait or run in (pending, due,
    running, a key's slots and queue, a rate's queue, parked, held, next in line, not gated
    yet) that are not empty."""
    names = {KEYS.parked, KEYS.held, KEYS.next_in_line, KEYS.ungated_tokens, KEYS.barred,
             KEYS.records, KEYS.running_records}
    for pattern in ("|due*", "|run*", "|slots|*", "|waitk|*", "|waitr|*", "|ungated|*"):
        names.update(r.scan_iter(match=KEYS.prefix + pattern))
    sizes = {}
    for name in sorted(names):
        kind = r.type(name)
        size = {"zset": r.zcard, "hash": r.hlen}.get(kind, lambda _: 0)(name)
        if size:
            sizes[name] = size
    return sizes


def test_old_and_new_listeners_and_producers_share_a_prefix_both_ways(
        last_release: Path, processes: Processes, redis_url: str, r: redis.Redis,
        tmp_path: Path) -> None:
    old = Release(f"{LAST_VERSION} ({LAST_RELEASE})", last_release)
    new = Release(f"{timers.__version__} (this tree)", ROOT)
    ledger = tmp_path / "ledger.txt"
    began = time.monotonic()
    with Timers(redis_url) as client:
        fleet = Fleet(processes, redis_url, ledger, client)
        scheduled: list[str] = []

        # old -> new: two old listeners, a batch from both producers coming due; a new
        # listener up beside them (a mixed fleet) and another batch, until its rate's burst
        # ran; then each old listener replaced by a new one as the timers come due
        first, second = fleet.listen(old), fleet.listen(old)
        assert r.get(KEYS.data_format) is None, "0.1.0 stores no format"
        scheduled += fleet.produce("up1", old, spread=8)
        third = fleet.listen(new)
        assert r.get(KEYS.data_format) == "1", "a listener of this release writes format 1"
        scheduled += fleet.mixed_batch("up2", old)
        fleet.stop(first)
        second = fleet.replace(second, new)
        wait_until(lambda: fleet.drained(scheduled), 30, interval=0.1,
                   message="every timer of the upgrade to run")
        upgraded = time.monotonic()

        # new -> old, the same way
        scheduled += fleet.produce("down1", old, spread=8)
        first = fleet.listen(old)
        scheduled += fleet.mixed_batch("down2", old)
        fleet.stop(third)
        second = fleet.replace(second, old)
        wait_until(lambda: fleet.drained(scheduled), 30, interval=0.1,
                   message="every timer of the downgrade to run")
        fleet.stop(first)
        fleet.stop(second)

        stats, dead = client.stats(), client.failed()
        # the run history, written by both releases, read by this one
        ended = {kind: len(client.history(task=f"jobs.{kind}", limit=1000)) for kind in BATCH}
        listed = len(client.history(limit=1000))
    took = time.monotonic() - began

    runs = [line.split() for line in fleet.lines()]
    counts = Counter(run[1] for run in runs)
    lost = sorted(set(scheduled) - set(counts))
    twice = sorted(tag for tag, n in counts.items() if n > 1)
    stray = sorted(set(counts) - set(scheduled))
    by_release = Counter((run[0], run[2]) for run in runs)
    print(f"\nrolling upgrade: {len(scheduled)} timers scheduled "
          f"({dict(Counter(tag.split('-')[2].split('@')[0] for tag in scheduled))}), "
          f"{len(runs)} runs, {len(lost)} lost, {len(twice)} twice, {len(stray)} stray; "
          f"runs by kind and release {dict(sorted(by_release.items()))}; "
          f"old->new {upgraded - began:.1f} s, both ways {took:.1f} s")
    assert len(scheduled) == len(set(scheduled)) == 8 * sum(BATCH.values())
    assert (lost, twice, stray) == ([], [], [])
    assert {run[2] for run in runs} == {LAST_VERSION, timers.__version__}, (
        "listeners of both releases ran timers")
    assert (stats.pending, stats.running) == (0, 0)
    assert [f"{f.timer_id}: {f.message}" for f in dead] == []
    assert leftovers(r) == {}
    assert (listed, ended) == (len(scheduled), {k: 8 * n for k, n in BATCH.items()})

    # a key's runs, whichever release ran them, one at a time
    spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for kind, tag, version, _pid, start, end in runs:
        if kind == "keyed":
            spans[tag.split("@")[1]].append((int(start), int(end), version))
    overlaps = [(key, a, b) for key, runs_of_key in spans.items()
                for a, b in itertools.pairwise(sorted(runs_of_key)) if b[0] < a[1]]
    assert overlaps == []

    # a rate's starts, whichever release ran them, spaced by one state: two releases each
    # keeping a rate of its own start runs side by side. Starts are noted as each task
    # entered, its dispatch after its gate. This release calls a rated task within its start
    # window of its gate (else it asks the gate again, T29), so a gap after one of its
    # starts is held to half an interval; the last release has no start window, and its
    # dispatch on a loaded machine may take tens of ms, so a gap after one of its starts is
    # held to a fifth of an interval (two runs let go side by side: a few ms apart).
    mixed = {run[2] for run in runs if run[0] == "paced" and run[1].startswith(("up2", "down2"))}
    assert mixed == {LAST_VERSION, timers.__version__}, (
        "the bursts due on the mixed fleets ran on both releases (else the spacing below "
        "would not show that they share the rate)")
    paced = sorted((int(run[4]), run[2]) for run in runs if run[0] == "paced")
    gaps = [((b[0] - a[0]) / 1e6, a[1], b[1]) for a, b in itertools.pairwise(paced)]
    least_ms = {timers.__version__: INTERVAL_MS / 2, LAST_VERSION: INTERVAL_MS / 5}
    print(f"paced: {len(paced)} starts, closest {min(gaps)[0]:.1f} ms apart, after a start "
          f"of this release {min(g for g, a, _ in gaps if a != LAST_VERSION):.1f} ms "
          f"(rate {RATE}: {INTERVAL_MS} ms)")
    close = [(round(gap, 1), a, b) for gap, a, b in gaps if gap < least_ms[a]]
    assert close == [], "starts closer than their release's dispatch allows (ms, releases)"


def test_timers_listen_refuses_a_newer_format_in_one_line(
        redis_url: str, timers_client: Timers, processes: Processes, r: redis.Redis) -> None:
    """A prefix a newer release wrote (format 2): ``timers listen`` exits 1 with one line,
    claiming nothing; the pending timer stays for a listener that can read it."""
    timers_client.schedule("jobs.plain", ["waits"], in_=0, id="waits")
    r.set(KEYS.data_format, "2")
    refused = processes.timers("listen", "--burst", "--url", redis_url,
                               "--tasks", "tests.upgrade_tasks")
    assert refused.wait(30) == 1
    output = processes.output(refused)
    (line,) = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert line == ("error: timers|format holds data format 2; this listener knows formats "
                    "up to 1: upgrade timers here (a newer release wrote that prefix); "
                    "nothing was written"), output
    assert "Traceback" not in output
    assert timers_client.stats().pending == 1, "nothing claimed"
    assert r.get(KEYS.data_format) == "2"
