"""The chaos checker's verdicts on hand-made histories: a clean one passes, and each kind of
violation is counted where it happened (and only there)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos.checker import (
    DEAD_NO_DEATH,
    DEAD_OTHER,
    EXPLAINED,
    FIFO,
    LATE_FINISH,
    LEFT_BEHIND,
    LOST,
    OLDER_TOKEN,
    OVER_LIMIT,
    RAN_CANCELLED,
    RATE,
    RESUMED,
    RETRIED,
    STALE_HELD,
    STALLED,
    STARTED_TWICE,
    TWICE,
    UNCOUNTED,
    UNFENCED,
    VIOLATIONS,
    Cancel,
    Cut,
    Dead,
    History,
    Mark,
    Move,
    Scheduled,
    check,
    checked_before_stop,
)
from bench.chaos.history import load, save
from bench.chaos.nemesis import outage_cuts

POISON = "chaos.poison"


class Builder:
    """A history written the way the tasks write it: ``run`` adds a start and an end."""

    def __init__(self) -> None:
        self.h = History(limits={"dev:0": 1, "cap": 2}, rates={"rated": 250.0})
        self.tokens: Iterator[int] = iter(range(1, 10_000))

    def timer(self, tid: str, task: str = "plain", key: str | None = None, seq: int = 0,
              due: float = 0.0, **kw: object) -> None:
        self.h.scheduled[tid] = Scheduled(tid, task, due, key, seq, **kw)  # type: ignore[arg-type]

    def run(self, tid: str, pid: int, start: float, end: float | None, *, ok: bool = True,
            token: int | None = None, task: str = "plain", key: str | None = None,
            lid: str = "L0", redis_ms: float | None = None, held: bool = True,
            attempt: int | None = None, fenced: float | None = None,
            probed: bool = False) -> None:
        """A start and (unless ``end`` is None) its end; ``attempt``: by default one more
        than the timer's start added before (each later start counted). ``probed``: the
        start line says when its fence let it start, ``fenced`` (None: no fence asked)."""
        if attempt is None:
            attempt = 1 + sum(m.kind == "S" and m.tid == tid for m in self.h.marks)
        tok = next(self.tokens) if token is None else token
        rms = start * 1000 if redis_ms is None else redis_ms
        common = dict(tid=tid, task=task, pid=pid, token=tok, listener=lid, key=key,
                      attempt=attempt)
        self.h.marks.append(Mark("S", mono=start, redis_ms=rms, held=held, fenced=fenced,  # type: ignore[arg-type]
                                 fence_known=probed, **common))
        if end is not None:
            self.h.marks.append(Mark("E", mono=end, ok=ok, **common))  # type: ignore[arg-type]


def counts(h: History) -> dict[str, int]:
    verdict = check(h, POISON)
    return {name: verdict.counts[name] for name in VIOLATIONS if verdict.counts[name]}


def clean() -> Builder:
    """A history with every fault the nemesis injects, explained, and no violation."""
    b = Builder()
    b.timer("a")
    b.run("a", 100, 1.0, 1.2)
    # killed mid-run at 5.0 (gone at 5.1), run again elsewhere after its lease
    b.timer("k")
    b.run("k", 100, 4.0, None)
    b.h.cuts.append(Cut("kill", 5.0, 5.1, frozenset({100})))
    b.run("k", 200, 7.5, 7.6, attempt=2)  # a rerun: its lease lapsed
    # finished 0.1 s before the kill: its ending may not be written yet
    b.timer("k2")
    b.run("k2", 100, 4.5, 4.9)
    b.run("k2", 200, 7.6, 7.7, attempt=2)
    # a retry after a failed attempt
    b.timer("f")
    b.run("f", 200, 2.0, 2.1, ok=False)
    b.run("f", 200, 2.7, 2.8, attempt=2)
    # one device, in order; its first command paused past the lease in pid 300 overlaps
    # the rerun (a late finish, not a violation)
    for seq in (1, 2, 3):
        b.timer(f"d{seq}", "keyed", "dev:0", seq, due=seq)
    b.run("d1", 300, 10.0, 16.0, key="dev:0", lid="L1")
    b.h.cuts.append(Cut("stop", 10.5, 15.0, frozenset({300}), fresh_for=2.25))
    b.run("d1", 200, 13.0, 13.5, key="dev:0", attempt=2)
    b.run("d2", 200, 13.5, 14.0, key="dev:0")
    b.run("d3", 200, 14.0, 14.2, key="dev:0")
    # a partition of L1 cuts its run; the rerun is explained
    b.timer("p")
    b.run("p", 301, 20.0, 21.0, lid="L1")
    b.h.cuts.append(Cut("partition", 20.5, 25.0, listener="L1", fresh_for=2.25))
    b.run("p", 200, 23.0, 23.1, attempt=2)
    # Redis restarted 24.0 to 25.0: a lease may lapse while no listener can renew it
    b.timer("q")
    b.run("q", 200, 23.9, 25.5)
    b.h.cuts.append(Cut("outage", 24.0, 27.0, listener="*", fresh_for=2.25))
    b.run("q", 500, 26.0, 26.1, lid="L2", attempt=2)
    # a cap of 2
    for n, (start, end) in enumerate([(30.0, 31.0), (30.2, 31.2), (31.0, 31.5)]):
        b.timer(f"c{n}", "capped")
        b.run(f"c{n}", 200, start, end, task="capped", key="cap")
    # a rate of 4/s, starts on the Redis clock 250 and 240 ms apart (within the slack)
    for n, at in enumerate([40_000.0, 40_250.0, 40_490.0]):
        b.timer(f"r{n}", "rated")
        b.run(f"r{n}", 200, at / 1000, at / 1000 + 0.01, task="rated", redis_ms=at)
    # a poison, dead after three crashes, each its process's death
    b.timer("z", POISON, must_complete=False)
    for attempt, (pid, at) in enumerate(((401, 50.0), (402, 53.0), (403, 56.0)), 1):
        b.run("z", pid, at, None, task=POISON, attempt=attempt)
    b.h.dead.append(Dead("z", "crashed", "ProcessDied", "its process died 3 times"))
    # a timer that ran beside the poison died with it, ran again and completed; another
    # started and returned as the poisoned process was dying: its ending was not written
    b.timer("w")
    b.run("w", 401, 49.9, None)
    b.run("w", 200, 53.0, 53.1, attempt=2)
    b.timer("w2")
    b.run("w2", 401, 50.004, 50.005)
    b.run("w2", 200, 53.0, 53.1, attempt=2)
    # a cancel that returned True, and one that came too late (False): that one runs
    b.timer("x1")
    b.timer("x2")
    b.h.cancels += [Cancel("x1", 60.0, True), Cancel("x2", 60.0, False)]
    b.run("x2", 200, 59.9, 60.1)
    # a batch moved at 70-71: one ran in the source before, the other in the target after
    b.timer("m1", "moved", moved=True)
    b.timer("m2", "moved", moved=True)
    b.h.moves.append(Move("moved", 70.0, 71.0, frozenset({"L0", "L1"}), "moved 1"))
    b.run("m1", 200, 69.0, 69.1, task="moved")
    b.run("m2", 500, 80.0, 80.1, task="moved", lid="L2")
    return b


def test_a_clean_history_with_every_fault_explained_has_no_violation() -> None:
    b = clean()
    verdict = check(b.h, POISON)
    assert verdict.ok, dict(verdict.examples)
    assert verdict.notes[EXPLAINED] == 9  # k, k2, d1, p, q, w, w2, the poison's 2 reruns
    assert verdict.notes[RETRIED] == 1
    assert verdict.notes[LATE_FINISH] == 1


def test_a_timer_that_never_completed_is_lost() -> None:
    b = clean()
    b.timer("lost-one")
    b.run("lost-one", 200, 90.0, 90.5, ok=False)  # it raised, and no retry followed
    assert counts(b.h) == {LOST: 1}


def test_a_second_completion_no_cut_explains_is_counted_twice() -> None:
    b = clean()
    b.timer("t")
    b.run("t", 100, 1.0, 1.1)
    b.run("t", 200, 30.0, 30.1)
    assert counts(b.h) == {TWICE: 1, STARTED_TWICE: 1}


def test_a_run_that_ended_long_before_its_process_died_is_no_excuse_for_a_rerun() -> None:
    """The ending of a finished run must be durable: a kill 1 s later explains nothing."""
    b = clean()
    b.timer("t")
    b.run("t", 100, 3.0, 4.0)  # pid 100 killed at 5.0
    b.run("t", 200, 30.0, 30.1)
    assert counts(b.h) == {TWICE: 1, STARTED_TWICE: 1}


def test_a_second_start_while_the_first_runs_in_a_healthy_process() -> None:
    b = clean()
    b.timer("t")
    b.run("t", 200, 90.0, None)
    b.run("t", 201, 92.0, 92.1)
    assert counts(b.h) == {STARTED_TWICE: 1}


def test_a_start_with_an_older_token_after_a_newer_one() -> None:
    """A paused process that, resumed, starts a rerun it no longer holds."""
    b = clean()
    b.timer("t")
    b.run("t", 300, 9.0, None, token=5000)  # in pid 300, stopped 10.5 to 15.0
    b.run("t", 200, 13.0, 13.1, token=5002)
    b.run("t", 300, 15.2, 15.3, token=5001)  # resumed, it starts its stale rerun
    verdict = check(b.h, POISON)
    assert {n: verdict.counts[n] for n in VIOLATIONS if verdict.counts[n]} == {
        OLDER_TOKEN: 1, TWICE: 1, STARTED_TWICE: 1}
    assert verdict.notes[STALE_HELD] == 1


@pytest.mark.parametrize(("after_resume", "explained"), [(0.0002, True), (0.05, False)])
def test_a_start_checked_right_before_its_process_was_stopped(
        after_resume: float, explained: bool) -> None:
    """Seen in a 30-minute run: a thread checked its run's lease, and the SIGSTOP came
    before the task's first line; the first line came 0.2 ms after the SIGCONT, with
    still_held() False, after the run had been recovered and completed elsewhere. Dated
    from the stop, it is a run the pause cut. A stale start 50 ms after the resume was
    not checked before the stop: a violation."""
    b = clean()
    b.timer("t")
    b.run("t", 200, 13.0, 13.1, token=5002, attempt=2)  # recovered while pid 300 stopped
    b.run("t", 300, 15.0 + after_resume, 15.0 + after_resume + 0.001, token=5001,
          held=False, attempt=1)  # pid 300 stopped 10.5 to 15.0
    verdict = check(b.h, POISON)
    assert counts(b.h) == ({} if explained else {OLDER_TOKEN: 1, TWICE: 1, STARTED_TWICE: 1})
    assert verdict.notes[RESUMED] == (1 if explained else 0)
    assert verdict.notes[EXPLAINED] == (1 if explained else 0) + check(clean().h, POISON).notes[
        EXPLAINED]


@pytest.mark.parametrize(("into", "explained"), [(1.0, True), (3.0, False)])
def test_a_start_in_a_paused_listener_s_child(into: float, explained: bool) -> None:
    """A quarantine child of a stopped listener may start a run while its lease holds (its
    lapse then explains the rerun); a start a lease into the pause has no lease at all."""
    b = clean()
    b.h.cuts.append(Cut("stop", 70.0, 76.0, frozenset({600, 601}), fresh_for=2.25))
    b.timer("u")
    b.run("u", 601, 70.0 + into, 70.5 + into)
    b.run("u", 200, 74.0, 74.1)
    assert counts(b.h) == ({} if explained else {TWICE: 1, STARTED_TWICE: 1})


@pytest.mark.parametrize(("every_shard_down", "explained"),
                         [(82.4, True), (None, False), (80.1, False)])
def test_a_run_on_a_healthy_shard_started_after_every_shard_refused(
        every_shard_down: float | None, explained: bool) -> None:
    """A primary killed at 80.0 (promoted at 84.0): the other shards' leases were renewed
    until every shard refused commands, so a run of theirs that started then, 3.2 s after
    the kill, held a lease; its lapse in the outage explains its rerun. Without that moment
    (or when it came at once), a start a lease into the outage has no lease."""
    b = clean()
    b.h.cuts.extend(outage_cuts(80.0, 84.0, every_shard_down, lease=2.0))
    b.h.limits["dev:1"] = 1
    b.timer("h", "keyed", "dev:1", 1)
    b.run("h", 200, 83.2, 84.2, key="dev:1")
    b.run("h", 201, 84.0, 84.1, key="dev:1")
    assert counts(b.h) == ({} if explained else {TWICE: 1, STARTED_TWICE: 1, OVER_LIMIT: 1})


def test_two_runs_of_one_key_at_once() -> None:
    b = clean()
    b.timer("d4", "keyed", "dev:0", 4, due=4)
    b.run("d4", 201, 14.1, 14.3, key="dev:0")  # d3 runs 14.0 to 14.2 in pid 200
    assert counts(b.h) == {OVER_LIMIT: 1}


def test_a_cap_of_two_exceeded_by_a_third() -> None:
    b = clean()
    b.timer("c9", "capped")
    b.run("c9", 201, 30.5, 30.6, task="capped", key="cap")
    assert counts(b.h) == {OVER_LIMIT: 1}


def test_a_run_cut_by_a_kill_holds_its_key_until_its_process_is_gone() -> None:
    b = clean()
    b.timer("d0", "keyed", "dev:0", 0, due=0)  # ahead of d1 in the key's order
    b.run("d0", 100, 4.8, None, key="dev:0")  # pid 100 killed at 5.0, gone at 5.1
    b.timer("d5", "keyed", "dev:x", 5)
    b.h.limits["dev:x"] = 1
    b.run("d0", 200, 5.05, 5.06, key="dev:0")  # before the process was gone
    assert counts(b.h) == {OVER_LIMIT: 1, LOST: 1}  # d5 never ran


def test_a_key_s_timers_started_out_of_due_order() -> None:
    b = clean()
    b.timer("e1", "keyed", "dev:1", 1, due=100)
    b.timer("e2", "keyed", "dev:1", 2, due=200)
    b.run("e2", 200, 90.0, 90.1, key="dev:1")
    b.run("e1", 200, 90.1, 90.2, key="dev:1")
    assert counts(b.h) == {FIFO: 1}


def test_starts_closer_than_the_rate_on_the_redis_clock() -> None:
    b = clean()
    b.timer("r9", "rated")
    b.run("r9", 201, 40.6, 40.61, task="rated", redis_ms=40_600.0)  # 110 ms after r2
    assert counts(b.h) == {RATE: 1}


@pytest.mark.parametrize("clock", ["redis", "monotonic"])
def test_a_rate_is_not_judged_on_one_clock_alone(clock: str) -> None:
    """A listener's estimate of the Redis clock may be off, a first line may come late:
    starts too close on one clock only are no violation."""
    b = clean()
    b.timer("r9", "rated")
    if clock == "redis":  # 110 ms on the listener's estimate, 300 ms on the machine's
        b.run("r9", 201, 40.79, 40.8, task="rated", redis_ms=40_600.0)
    else:  # 300 ms on the Redis clock, 110 ms between the first lines
        b.run("r9", 201, 40.6, 40.61, task="rated", redis_ms=40_790.0)
    assert counts(b.h) == {}


def test_dead_for_crashes_with_no_death_while_it_ran() -> None:
    """Its only run was in a paused process: a pause is not a death."""
    b = clean()
    b.timer("s", "keyed")
    b.run("s", 300, 10.2, None)
    b.h.dead.append(Dead("s", "crashed", "ProcessDied",
                         "its listener went away 3 times while holding it"))
    assert counts(b.h) == {DEAD_NO_DEATH: 1, LOST: 1}


def test_dead_for_another_reason() -> None:
    b = clean()
    b.timer("o")
    b.h.dead.append(Dead("o", "error", "KeyError", "internal error: 'SOME_VARIABLE'"))
    assert counts(b.h) == {DEAD_OTHER: 1, LOST: 1}


@pytest.mark.parametrize("how", ["ran in the source", "pending in the source"])
def test_a_timer_the_move_left_behind(how: str) -> None:
    b = clean()
    b.timer("m3", "moved", moved=True)
    if how == "ran in the source":
        b.run("m3", 200, 85.0, 85.1, task="moved")
    else:
        b.run("m3", 500, 85.0, 85.1, task="moved", lid="L2")
        b.h.left_in_source.add("m3")
    assert counts(b.h) == {LEFT_BEHIND: 1}


def test_a_timer_that_ran_after_its_cancel_returned_true() -> None:
    b = clean()
    b.run("x1", 200, 61.0, 61.1)
    assert counts(b.h) == {RAN_CANCELLED: 1}


def test_a_saved_history_is_judged_again_the_same(tmp_path: Path) -> None:
    """``--check DIR`` reads what a run saved: the same verdict as the run's own."""
    b = clean()
    b.timer("t")
    b.run("t", 100, 3.0, 4.0, fenced=2.9, probed=True)
    b.run("t", 200, 30.0, 30.1)
    b.timer("u")
    b.run("u", 200, 31.0, 31.1, probed=True)  # no fence asked
    with (tmp_path / "ledger.jsonl").open("w") as ledger:
        for m in b.h.marks:
            line = {"k": m.kind, "id": m.tid, "task": m.task, "pid": m.pid, "mono": m.mono,
                    "tok": m.token, "held": m.held, "lid": m.listener, "rms": m.redis_ms,
                    "att": m.attempt, "orig": m.original_due_ms, "rec": m.recurrence,
                    "key": m.key, "seq": m.seq}
            if m.ok is not None:
                line["ok"] = m.ok
            if m.fence_known:
                line["fchk"] = m.fenced
            ledger.write(json.dumps(line) + "\n")
    save(b.h, tmp_path)
    again = check(load(tmp_path), POISON)
    assert again.counts == check(b.h, POISON).counts == {TWICE: 1, STARTED_TWICE: 1,
                                                         UNFENCED: 1}
    assert again.notes == check(b.h, POISON).notes


@pytest.mark.parametrize(("fenced", "explained"), [(10.4, True), (15.02, False)])
def test_a_start_is_dated_from_its_fence(fenced: float, explained: bool) -> None:
    """Seen once in CI: an ``async def`` run's stale start came after the SIGCONT, later
    than the grace for a start checked before the stop. Where the ledger says when the
    fence let a run start, that decides: checked before the stop (10.4, the stop began
    at 10.5), it is a run the pause cut, however long its first line took after the
    resume (here 60 ms); checked after the resume, it is a violation."""
    b = clean()
    b.timer("t")
    b.run("t", 200, 13.0, 13.1, token=5002, attempt=2, probed=True, fenced=12.99)
    b.run("t", 300, 15.06, 15.07, token=5001, held=False, attempt=1, probed=True,
          fenced=fenced)  # pid 300 stopped 10.5 to 15.0
    verdict = check(b.h, POISON)
    assert counts(b.h) == ({} if explained else {OLDER_TOKEN: 1, TWICE: 1, STARTED_TWICE: 1})
    assert verdict.notes[RESUMED] == (1 if explained else 0)


@pytest.mark.parametrize("stalled", [True, False])
def test_a_stall_no_fault_caused_is_a_cut(stalled: bool) -> None:
    """Seen once in a Sentinel run: every process of the supervised listener went 1.5 s
    without running, no fault injected, its runs' leases lapsed and they were run again
    elsewhere while the first runs were frozen; those finished after. Noted by the stall
    watch, that is a pause like a SIGSTOP (late finishes, explained second starts); not
    noted, the same history is a violation."""
    b = clean()
    b.timer("t")
    b.run("t", 700, 39.0, 42.6, held=False)  # its process stalled 40.0 to 42.55
    b.run("t", 200, 42.2, 42.3, attempt=2)
    if stalled:
        b.h.cuts.append(Cut("stall", 40.0, 42.55, frozenset({700}), fresh_for=2.25))
    verdict = check(b.h, POISON)
    assert counts(b.h) == ({} if stalled else {TWICE: 1, STARTED_TWICE: 1})
    assert verdict.notes[STALLED] == (1 if stalled else 0)


def test_a_start_no_fence_checked_is_a_violation() -> None:
    """A start line that says no fence let its run start: the run skipped invariant 12."""
    b = clean()
    b.timer("t")
    b.run("t", 200, 13.0, 13.1, probed=True, fenced=12.99)
    b.timer("u")
    b.run("u", 200, 14.0, 14.1, probed=True, fenced=None)
    assert counts(b.h) == {UNFENCED: 1}


def test_a_run_claimed_right_after_a_resume_keeps_its_start() -> None:
    """A start right after a SIGCONT with its timer's newest token is a run claimed then
    (a retry's next attempt, seen in a 30-minute run): dated from the stop instead, it
    would come before the attempts it followed."""
    b = Builder()
    b.timer("f")
    b.run("f", 200, 1.0, 1.1, ok=False, token=7001)
    b.run("f", 300, 15.0001, 15.1, token=7002)  # pid 300 stopped 10.5 to 15.0
    stop = Cut("stop", 10.5, 15.0, frozenset({300}), fresh_for=2.25)
    assert [m.mono for m in checked_before_stop(b.h.marks, [stop])] == [
        m.mono for m in b.h.marks]


@pytest.mark.parametrize("attempt", [1, 2])
def test_a_second_start_with_no_rerun_counted_is_a_violation(attempt: int) -> None:
    """A run cut by a kill and run again elsewhere is explained, if that start is a rerun
    (its attempt above the first's); one with no rerun counted (a claim a failover lost,
    a quarantine child not counted) is a violation, cut or not."""
    b = Builder()
    b.timer("k")
    b.run("k", 100, 4.0, None)
    b.h.cuts.append(Cut("kill", 5.0, 5.1, frozenset({100})))
    b.run("k", 200, 7.5, 7.6, attempt=attempt)
    verdict = check(b.h, POISON)
    assert counts(b.h) == ({UNCOUNTED: 1} if attempt == 1 else {})
    assert verdict.notes[EXPLAINED] == 1
    assert len(verdict.examples[UNCOUNTED]) == (1 if attempt == 1 else 0)
