"""Model-based test of flow control (``docs/state-machine.md``, "The model test"):
hypothesis drives the real Lua scripts on fakeredis (``tests/unit/model_flow.py``) with
virtual listeners that use the listener's real lease classes, and random interleavings of
schedule, claim, park, gate and start, finish (ok, retry, dead), renew, a lapse of time,
pause and resume, kill, cancel, reschedule, hand-back, a server restart (one that may lose
its last writes, for the rate's invariant), quarantine children that start reruns or die;
every reply is judged against the model's own history after every step, and every
history ends drained (``FlowModel.teardown``, the ``world`` fixture).

``fenced`` runs the listener that asks Redis before every start; ``local_fence`` the one
``timers/listener`` has (its ``Fence`` asks Redis only after a stall). The default run is
bounded (``TIMERS_MODEL_EXAMPLES``); ``TIMERS_MODEL_LONG=1`` or ``-m model_long`` runs the
long profile (one family of invariants per test, each shrinking to its own
counterexample).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import fakeredis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.unit.model_flow import (
    KS,
    LEASE_MS,
    PLAIN,
    POLICY,
    RATED,
    START_MS,
    Snapshot,
    Violation,
    VirtualClock,
    VListener,
    World,
    child_checks_fence,
    redis_clock,
    restore,
    snapshot,
)
from timers.model.keys import DEFAULT_GROUP

LONG = bool(os.environ.get("TIMERS_MODEL_LONG"))
SHORT = (int(os.environ.get("TIMERS_MODEL_EXAMPLES", "120")), 40)
LONG_RUN = (int(os.environ.get("TIMERS_MODEL_LONG_EXAMPLES", "1000")), 80)
"""(max_examples, stateful_step_count) of the default and the long profile (CI runs the
long one with fewer examples: ``.ci/run``)."""

KINDS = ("fenced", "key_limit", "fifo", "rate", "early", "uncounted", "cancelled_ran", "lost",
         "stolen", "revived", "ending", "twice", "older_token", "stuck", "dead_without_death")

KEYS = ["", "k1", "k1", "k1", "k2"]
pick = st.integers(0, 50)
"""An index into whatever list the rule picks from (taken modulo its length)."""


class FlowModel(RuleBasedStateMachine):
    FENCED = False
    LOCAL_FENCE = False
    CHECKS: frozenset[str] = frozenset(KINDS)
    LOSSY = False
    """Whether a server restart may come back without its last writes (a machine crash
    with ``appendfsync everysec``, snapshots only): only the rate's invariant is asked to
    hold then (the others need every acknowledged write kept)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self._clock = redis_clock(self.clock)
        self._clock.__enter__()
        self.server = fakeredis.FakeServer()
        self.client = fakeredis.FakeRedis(server=self.server)
        self.world = World(self.client, self.clock, self.FENCED, self.LOCAL_FENCE)
        # a rerun's child starts later than its parent's fence check only where the child
        # checks the fence itself (it does: the scenario
        # test_a_rerun_queued_for_a_child_while_its_lease_lapses_does_not_start)
        self.world.child_delay = self.world.child_fence
        self.snapshots: list[tuple[int, Snapshot]] = []
        """(Redis clock ms, the data then) after each step, when LOSSY."""

    def teardown(self) -> None:
        """Every history ends drained (:meth:`World.drain`), unless it failed already or
        its server may have lost writes."""
        try:
            if not self.LOSSY and not self._broken():
                self.world.drain()
                self._raise_broken()
        finally:
            self.client.close()
            self._clock.__exit__(None, None, None)

    def _broken(self) -> list[Violation]:
        return [v for v in self.world.violations if v.kind in self.CHECKS]

    def _raise_broken(self) -> None:
        broken = self._broken()
        if broken:
            first = broken[0].text.rsplit(" (at ", 1)[0]
            raise AssertionError(f"{broken[0].kind}: {broken[0].text}\nhistory:\n"
                                 f"{self.world.story(violation=first)}")

    @initialize(backlog=st.lists(st.tuples(st.sampled_from([PLAIN, PLAIN, RATED]),
                                           st.sampled_from(KEYS), st.sampled_from([0, 0, 5]),
                                           st.sampled_from([-50, -10, 0])), max_size=6))
    def start(self, backlog: list[tuple[str, str, int, int]]) -> None:
        """Two listeners, and a backlog of timers due (a burst on a fresh server)."""
        self.world.spawn((DEFAULT_GROUP, "g2"))
        self.world.spawn((DEFAULT_GROUP,))
        if backlog:  # in one call, as schedule_many sends a burst
            self.world.schedule_many([(task, DEFAULT_GROUP, priority, key, in_ms)
                                      for task, key, priority, in_ms in backlog])

    def _listener(self, i: int) -> VListener | None:
        alive = [li for li in self.world.listeners if li.alive]
        listener = alive[i % len(alive)]
        return None if listener.paused else listener

    # -- the producer

    @rule(task=st.sampled_from([PLAIN, PLAIN, RATED]),
          group=st.sampled_from([DEFAULT_GROUP, DEFAULT_GROUP, "g2"]),
          priority=st.sampled_from([0, 0, 5]), key=st.sampled_from(KEYS),
          in_ms=st.sampled_from([-50, 0, 0, 10, 30, 200]))
    def schedule(self, task: str, group: str, priority: int, key: str, in_ms: int) -> None:
        self.world.schedule(task, group, priority, key, in_ms)

    @rule(timers=st.lists(st.tuples(st.sampled_from([PLAIN, RATED]),
                                    st.sampled_from([DEFAULT_GROUP, "g2"]),
                                    st.sampled_from([0, 5]), st.sampled_from(KEYS),
                                    st.sampled_from([-50, 0, 30, 200])),
                          min_size=2, max_size=4))
    def schedule_many(self, timers: list[tuple[str, str, int, str, int]]) -> None:
        self.world.schedule_many(timers)

    @precondition(lambda self: self.world.timers)
    @rule(i=pick)
    def cancel(self, i: int) -> None:
        ids = list(self.world.timers)
        self.world.cancel(ids[i % len(ids)])

    @precondition(lambda self: self.world.timers)
    @rule(i=pick, in_ms=st.sampled_from([0, 20, 300]))
    def reschedule(self, i: int, in_ms: int) -> None:
        ids = list(self.world.timers)
        self.world.reschedule(ids[i % len(ids)], in_ms)

    # -- listeners

    @rule(i=pick, limit=st.sampled_from([1, 2, 5]), horizon=st.sampled_from([0, 0, 50]),
          events=st.booleans(), screen=st.booleans())
    def claim(self, i: int, limit: int, horizon: int, events: bool, screen: bool) -> None:
        listener = self._listener(i)
        if listener is not None:
            self.world.claim(listener, limit, horizon, events, screen)

    @rule(i=pick)
    def start_due(self, i: int) -> None:
        """A listener starts its claimed runs whose due time has come (gate first)."""
        listener = self._listener(i)
        if listener is not None:
            self.world.start_due(listener)

    @rule(i=pick, limit=st.sampled_from([2, 10]))
    def park(self, i: int, limit: int) -> None:
        listener = self._listener(i)
        if listener is not None:
            self.world.park(listener, limit)

    @rule(i=pick, j=pick, kind=st.sampled_from(["ok", "ok", "ok", "retry", "dead"]),
          delay=st.sampled_from([0, 40]), gate=st.sampled_from([True, True, False]))
    def finish(self, i: int, j: int, kind: str, delay: int, gate: bool) -> None:
        """A run ends; the runs handed along are gated at once, or (``gate`` False) at the
        listener's next start of due runs: a stall may come between."""
        listener = self._listener(i)
        if listener is not None and listener.executing:
            tokens = sorted(listener.executing)
            self.world.finish(listener, tokens[j % len(tokens)], kind, delay, gate)

    @rule(i=pick, j=pick, kind=st.sampled_from(["ok", "dead"]))
    def end_before_gate(self, i: int, j: int, kind: str) -> None:
        """A claimed run ends before its gate (T28): missed, refused, or ended the same
        way as an earlier run of it that returned in a process now gone."""
        listener = self._listener(i)
        if listener is not None and listener.claimed:
            tokens = sorted(listener.claimed, key=int)
            self.world.end_before_gate(listener, tokens[j % len(tokens)], kind)

    @rule(i=pick)
    def renew(self, i: int) -> None:
        listener = self._listener(i)
        if listener is not None:
            self._renew(listener)

    def _renew(self, listener: VListener) -> None:
        lost = self.world.renew_all(listener)
        if self.FENCED:  # runs not started yet are dropped; started ones go on
            for token in lost:
                listener.claimed.pop(token, None)
                listener.nexts.pop(token, None)
                listener.children.pop(token, None)

    @rule(i=pick, j=pick)
    def hand_back(self, i: int, j: int) -> None:
        listener = self._listener(i)
        if listener is not None and (listener.claimed or listener.nexts):
            tokens = sorted([*listener.claimed, *listener.nexts])
            self.world.hand_back(listener, tokens[j % len(tokens)])

    @rule(i=pick)
    def pause(self, i: int) -> None:
        listener = self._listener(i)
        if listener is not None and sum(not li.paused for li in self.world.listeners
                                        if li.alive) > 1:
            listener.paused = True
            self.world.note(f"{listener.id} paused")

    @rule(i=pick, tries=st.sampled_from([0, 1, 2]))
    def lag(self, i: int, tries: int) -> None:
        """A listener's dispatch turns slow (or quick again): its rate runs miss their
        start windows, on their first try (1) or on both (2)."""
        alive = [li for li in self.world.listeners if li.alive]
        listener = alive[i % len(alive)]
        if listener.lagging != tries:
            listener.lagging = tries
            self.world.note(f"{listener.id} {f'lags ({tries})' if tries else 'keeps up'}")

    @rule()
    def resume(self) -> None:
        for listener in self.world.listeners:
            if listener.alive and listener.paused:
                listener.paused = False
                self.world.note(f"{listener.id} resumed")

    @rule(i=pick)
    def kill(self, i: int) -> None:
        alive = [li for li in self.world.listeners if li.alive]
        listener = alive[i % len(alive)]
        self.world.kill(listener)
        self.world.spawn(listener.groups)

    # -- the process topology (docs/state-machine.md, "Who holds a run")

    @rule(i=pick, j=pick)
    def child_start(self, i: int, j: int) -> None:
        """A quarantine child, loaded, starts the rerun its parent queued for it: its
        parent may have been paused since (a child is a process of its own)."""
        alive = [li for li in self.world.listeners if li.alive and li.children]
        if alive:
            listener = alive[i % len(alive)]
            tokens = sorted(listener.children, key=int)
            self.world.child_start(listener, tokens[j % len(tokens)])

    @rule(i=pick, j=pick)
    def child_dies(self, i: int, j: int) -> None:
        """A quarantine child dies in its run (a poison): a death its parent sees."""
        alive = [li for li in self.world.listeners if li.alive and li.in_child]
        if alive:
            listener = alive[i % len(alive)]
            tokens = sorted(listener.in_child, key=int)
            self.world.kill_child(listener, tokens[j % len(tokens)])

    @precondition(lambda self: self.world.endings_survive)
    @rule(i=pick)
    def die_unwritten(self, i: int) -> None:
        """A listener process dies right after its tasks returned, their endings not
        written yet (the endings journal keeps them)."""
        alive = [li for li in self.world.listeners if li.alive]
        listener = alive[i % len(alive)]
        self.world.die_unwritten(listener)
        self.world.spawn(listener.groups)

    @rule(i=pick)
    def stop(self, i: int) -> None:
        """SIGTERM: a listener stops, handing back what it has not started and, past its
        shutdown timeout, what is still going; a new one takes its place."""
        alive = [li for li in self.world.listeners if li.alive and not li.paused]
        if alive:
            listener = alive[i % len(alive)]
            self.world.stop(listener)
            self.world.spawn(listener.groups)

    # -- time and the server

    @rule(ms=st.sampled_from([1, 10, 50, 100, 400, 1200]))
    def advance(self, ms: int) -> None:
        """Time goes on; the renewal thread of each listener not paused renews its leases
        every third of a lease meanwhile."""
        while ms > 0:
            for listener in self.world.listeners:
                if listener.alive and not listener.paused:
                    self._renew(listener)
            step = min(ms, LEASE_MS // 3)
            self.clock.ms += step
            ms -= step
            for listener in self.world.listeners:  # each starts what came due
                if listener.alive and not listener.paused:
                    self.world.start_due(listener)
            for listener in self.world.listeners:  # children are processes of their own
                if listener.alive:
                    for token in sorted(listener.children, key=int):
                        if token in listener.children:  # (an earlier one's gate may drop it)
                            self.world.child_start(listener, token)

    @rule(i=pick, ms=st.sampled_from([600, 1500]), others_claim=st.booleans(),
          then_ends=st.booleans())
    def stall(self, i: int, ms: int, others_claim: bool, then_ends: bool) -> None:
        """A listener stops (SIGSTOP, a long GC pause) for ``ms`` while the others go on
        (and claim, if ``others_claim``), then goes on from its stale view (and, with
        ``then_ends``, the task it was running first returns)."""
        listener = self._listener(i)
        if listener is None:
            return
        listener.paused = True
        self.world.note(f"{listener.id} stalls for {ms} ms")
        self.advance(ms)
        if others_claim:
            for other in self.world.listeners:
                if other.alive and not other.paused:
                    self.world.claim(other, 5, 0, False)
                    self.world.start_due(other)
        listener.paused = False
        self.world.note(f"{listener.id} goes on")
        if then_ends and listener.executing:
            self.world.finish(listener, min(listener.executing, key=int), "ok", 0)

    @rule(down_ms=st.sampled_from([10, 100, 2000]),  # 2 s: leases lapse while it is down
          lost_ms=st.sampled_from([0, 1, 50, 400, 1000]))
    def restart_server(self, down_ms: int, lost_ms: int) -> None:
        """A restart: time goes on, the script cache is empty (the wrappers load the scripts
        again), the server's uptime starts again. It keeps every write (AOF), or with LOSSY
        comes back with its data as it was ``lost_ms`` before it went down (the last state
        of a step at least that old)."""
        if self.LOSSY and lost_ms:
            kept = [(ms, data) for ms, data in self.snapshots if ms <= self.clock.ms - lost_ms]
            if kept:
                restore(self.server, kept[-1][1])
                self.world.note(f"server lost its writes since +{kept[-1][0] - START_MS}")
        self.clock.ms += down_ms
        self.clock.boot_ms = self.clock.ms
        self.client.script_flush()
        self.world.note(f"server restarted after {down_ms} ms")

    # -- the invariants

    @invariant()
    def holds(self) -> None:
        if self.LOSSY:
            self.snapshots = [*self.snapshots[-30:], (self.clock.ms, snapshot(self.server))]
        if "lost" in self.CHECKS:
            self.world.check_nothing_lost()
        self._raise_broken()


def model(kinds: tuple[str, ...], fenced: bool = False, long: bool = False,
          shrink: bool = True, lossy: bool = False, local_fence: bool = False) -> type:
    """A test case of the model checking ``kinds`` only; without ``shrink`` a failure is
    reported as found (shrinking a history of the model takes minutes: the default run
    reports what it found); with ``lossy`` a restart may lose the server's last writes;
    ``local_fence``: the listener's own fence (``World.must_ask``)."""
    name = "_".join(kinds) + "_fenced" * fenced + "_lossy" * lossy + "_fence" * local_fence
    machine: type[FlowModel] = type(
        f"Model_{name}", (FlowModel,), {"FENCED": fenced, "CHECKS": frozenset(kinds),
                                        "LOSSY": lossy, "LOCAL_FENCE": local_fence})
    examples, steps = LONG_RUN if long or LONG else SHORT
    shrink = shrink and not os.environ.get("TIMERS_MODEL_NO_SHRINK")
    case: type = machine.TestCase
    case.settings = settings(  # type: ignore[attr-defined]
        max_examples=examples, stateful_step_count=steps, deadline=None, print_blob=True,
        # CI replays one fixed set of histories (a failure there is reproducible as it is);
        # a developer's run draws new ones each time
        derandomize=bool(os.environ.get("CI")),
        phases=[p for p in Phase if shrink or p not in (Phase.shrink, Phase.explain)],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    # a class runs its histories one after another: more than a test's usual 120 s on a
    # loaded machine (CI runs the suite over every core)
    return pytest.mark.timeout(1800 if long or LONG else 600)(case)


@pytest.fixture(scope="module", autouse=True)
def timed(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.perf_counter()
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(f"model flow test: {time.perf_counter() - started:.1f} s")


@pytest.fixture(autouse=True)
def _long_only_when_asked(request: pytest.FixtureRequest) -> None:
    if (request.node.get_closest_marker("model_long") and not LONG
            and "model_long" not in (request.config.option.markexpr or "")):
        pytest.skip("the long model profile: -m model_long or TIMERS_MODEL_LONG=1")


# -- the counterexamples the model found, as scenarios ------------------------------------
# Each is a shrunk history of the model, replayed step by step on the same virtual world,
# and asserts the invariant it broke.


DRAINED = ("lost", "stolen", "revived", "ending", "twice", "stuck")
"""What every scenario's history must keep once drained (the fixture drains it)."""


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """A virtual world; once the scenario is done, its history is drained and must keep
    :data:`DRAINED` (but for a scenario marked ``no_drain``: an expected failure)."""
    clock = VirtualClock()
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    with redis_clock(clock):
        world = World(client, clock, fenced=False)
        yield world
        if request.node.get_closest_marker("no_drain") is None:
            world.drain()
            broken = [v for v in world.violations if v.kind in DRAINED]
            assert not broken, f"{broken[0].kind}: {broken[0].text}\n{world.story()}"
    client.close()


def broken(world: World, kind: str) -> list[str]:
    return [v.text for v in world.violations if v.kind == kind]


def drain(world: World, listener: VListener, rounds: int) -> None:
    """``rounds`` times: 50 ms on (the listener renewing), then it claims, starts what is
    due and lets every run it holds end ok."""
    for _ in range(rounds):
        wait(world, 50, listener)
        world.claim(listener, 5, 0, False)
        world.start_due(listener)
        for token in sorted(listener.executing):
            world.finish(listener, token, "ok", 0)


def wait(world: World, ms: int, *renewing: VListener) -> None:
    """Time goes on; the listeners given renew their leases meanwhile."""
    while ms > 0:
        for listener in renewing:
            world.renew_all(listener)
        step = min(ms, LEASE_MS // 3)
        world.clock.ms += step
        ms -= step


def rerun_elsewhere(world: World, task: str,
                    cut: Callable[[World, VListener], None] = World.kill) -> VListener:
    """A timer of ``task`` due, claimed and started by a listener that ``cut`` then cuts
    (killed; or dead with its ending unwritten); a second listener claims it when its
    lease has lapsed and starts it: the rerun. Returns the second listener."""
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(task, DEFAULT_GROUP, 0, "", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    cut(world, l1)
    l2 = world.spawn((DEFAULT_GROUP,))
    wait(world, 1100, l2)
    world.claim(l2, 5, 0, False)
    world.start_due(l2)
    return l2



def test_a_paused_listener_starts_no_run_next_in_line_it_no_longer_holds(world: World) -> None:
    """Finding 1, fixed by fencing: the listener revalidates after a stall."""
    world.fenced = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    for i in range(3):
        world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50 + i)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # t0 goes, t1 and t2 wait for k1
    world.finish(l1, sorted(l1.executing)[0], "ok", 0)  # t1 handed, t2 next in line
    l1.paused = True
    wait(world, 1200, l2)  # l1 is stopped past its lease
    world.claim(l2, 5, 0, False)
    world.start_due(l2)  # l2 reruns t1 (recovered); t2 waits for k1 again
    l1.paused = False
    world.finish(l1, sorted(l1.executing)[0], "ok", 0)  # t1 returns: t2 starts in its thread
    assert broken(world, "fenced") == [] and broken(world, "key_limit") == []


def test_a_run_cut_off_by_a_restart_still_holds_its_keys_slot(world: World) -> None:
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.claim(l1, 1, 0, False)
    world.start_due(l1)
    world.clock.ms += 2000  # Redis restarts for 2 s: nobody can renew
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.claim(l1, 1, 0, True)  # named by its expired event: claimed before any recovery
    world.start_due(l1)  # t0's slot lapsed with its lease: t1 goes while t0 still runs
    assert broken(world, "key_limit") == []


def test_a_keys_slot_goes_to_the_earliest_claimed_timer(world: World) -> None:
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -40)
    world.claim(l1, 1, 0, False)
    world.claim(l2, 1, 0, False)
    world.start_due(l2)
    world.start_due(l1)
    assert broken(world, "fifo") == []


def test_after_a_takeover_the_rerun_goes_first(world: World) -> None:
    world.fenced = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -40)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # t0 goes, t1 waits
    world.kill(l1)
    wait(world, 1200)
    world.claim(l2, 5, 0, False)  # t0's rerun, and t1 promoted when t0's slot was freed
    world.start_due(l2)
    assert broken(world, "fifo") == []


def test_rate_and_concurrency_starts_keep_the_interval(world: World) -> None:
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)  # x: takes the rate slot at 0
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(RATED, DEFAULT_GROUP, 0, "k1", -40)  # y: k1 free, rate busy: paces at 100
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(PLAIN, DEFAULT_GROUP, 5, "k1", -30)  # z: holds k1 (ahead of y: priority)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    wait(world, 100, l1)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # y has its rate slot, but k1 is z's: y waits, paid
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -10)  # w: paces at 200
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    wait(world, 100, l1)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # w starts at 200
    wait(world, 10, l1)
    z = next(t for t, r in l1.executing.items() if r.timer_id == "t002")
    world.finish(l1, z, "ok", 0)  # k1 frees: y is handed over and starts at 210
    assert broken(world, "rate") == []


@pytest.mark.parametrize("pacer", [False, True])
def test_a_rate_run_past_its_start_window_moves_the_rates_slots_on_when_it_asks_again(
        world: World, pacer: bool) -> None:
    """A rate's run let go that reaches its call ``LATE_MS`` past its window asks its gate
    again (T29): its unused slot moves to now, the rate's next slot as far on, whether a
    run held for the rate since made a pacer of it (``pacer``) or a later gate finds it.
    Started late, its run keeps the interval to the next start either way."""
    world.fenced = True
    late, quick = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    late.lagging = 1
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)
    if pacer:  # the second waits for the rate, its pacer, before the first reaches its call
        world.schedule(RATED, DEFAULT_GROUP, 0, "", -40)
    world.claim(late, 5, 0, False)
    world.start_due(late)
    assert len(late.executing) == 1, world.story()
    if not pacer:  # the second comes once the first started
        world.schedule(RATED, DEFAULT_GROUP, 0, "", -40)
    for _ in range(8):
        wait(world, 30, late, quick)
        world.claim(quick, 5, 0, False)
        world.start_due(quick)
    assert len(quick.executing) == 1, world.story()
    assert broken(world, "rate") == [], world.story()


def test_a_keyed_timer_handed_over_does_not_start_before_its_due_time(world: World) -> None:
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # t0 holds k1
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", 30)
    world.claim(l1, 5, 50, False, screen=True)  # claimed 30 ms ahead, screened: waits
    wait(world, 10, l1)
    world.finish(l1, sorted(l1.executing)[0], "ok", 0)  # t1 handed over at 10 ms
    assert broken(world, "early") == []


def test_a_rerun_handed_back_is_still_counted_when_it_starts(world: World) -> None:
    """A rerun (its listener stalled past its lease) that another listener claims and then
    hands back unstarted (stopping, or out of memory) keeps its reruns (";rc="): its next
    start is counted as a rerun, in quarantine (before: reruns 0 again, in the listener).
    A rerun is never a crash: only deaths seen in quarantine are (test_crashes.py)."""
    world.fenced = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # t0 runs on l1
    l1.paused = True
    wait(world, 1200, l2)
    world.claim(l2, 5, 0, False)  # t0's rerun (reruns 1), holding t0's slot
    (token,) = list(l2.claimed)
    world.hand_back(l2, token)  # l2 stops before it starts it
    world.claim(l2, 5, 0, False)
    world.start_due(l2)
    assert broken(world, "uncounted") == []


@pytest.mark.no_drain  # its server lost writes: only the rate's invariant is asked then
def test_a_rate_keeps_its_interval_when_the_server_lost_its_last_writes(world: World) -> None:
    """Finding 4 (kill -9 of Redis): a server that comes back without its last second of
    writes (a machine crash with appendfsync everysec; snapshots only) has forgotten the
    rate's last start; the next start still comes an interval after it (before: 10 ms)."""
    world.fenced = True
    server = world.r.connection_pool.connection_kwargs["server"]
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)
    saved = snapshot(server)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # t0 starts at 0: its claim and the rate's tat are in the lost writes
    restore(server, saved)
    world.clock.ms += 10
    world.clock.boot_ms = world.clock.ms
    world.r.script_flush()
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -5)
    for _ in range(30):  # 3 s: t0 again and t1, each an interval after the last start
        world.claim(l1, 5, 0, False)
        world.start_due(l1)
        for token in list(l1.executing):
            world.finish(l1, token, "ok", 0)
        wait(world, 100, l1)
    assert broken(world, "rate") == []
    assert world.timers["t001"].status == "done" and world.timers["t000"].status == "done"


def test_a_keyed_run_handed_back_unstarted_leaves_no_place_in_the_order_barrier(
        world: World) -> None:
    """A keyed timer's claim notes it in its key's order barrier; handed back before its
    gate (T17: its listener stops) and then cancelled, it must leave nothing there (before,
    its note stayed for good unless a later timer of the key came to be checked behind it.
    Found by the drained model)."""
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k2", 0)  # t000: noted in k2's barrier
    world.claim(l1, 1, 0, False)
    (token,) = l1.claimed
    world.hand_back(l1, token)
    world.cancel("t000")
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k2", -10)  # t001: due before it
    # the fixture drains: t001 runs, and nothing of t000 may be left


def test_a_keyed_run_handed_back_unstarted_then_parked_leaves_its_barrier_to_its_queue(
        world: World) -> None:
    """Handed back before its gate (T17), a keyed timer's place in its key's order barrier
    is noted as pending there (``p|``). The parker then puts it into its key's queue (T6),
    which keeps its place from then on, as a gate that holds a run there does: parking
    drops the note as gating does. (It stayed: a run handed over from the queue holding
    the slot asks no gate, so nothing dropped it after the timer ran. Found by the drained
    model: ``ungatedt`` left behind.)"""
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -10)  # t000: runs first, holds k1's slot
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", 0)  # t001
    world.claim(l1, 1, 0, False)
    world.start_due(l1)
    world.claim(l1, 1, 0, False)
    (token,) = l1.claimed
    world.hand_back(l1, token)  # t001: noted "p|" in k1's barrier
    assert world.r.hget(KS.ungated_tokens, "t001") == b"p|k:k1"
    world.park(l1, 5)  # into k1's queue, behind t000's run
    assert world.r.zrange(KS.key_queue("k1"), 0, -1) == [b"t001"]
    assert world.r.hget(KS.ungated_tokens, "t001") is None
    # the fixture drains: both run, in order, and nothing of either is left


def test_a_pacer_whose_slot_a_restart_lost_passes_the_rate_on_when_its_key_is_full(
        world: World) -> None:
    """T21 with a full key: a pacer gated after a restart that came after its slot is the
    pacer no more; its key being full, it waits for the key. The rate's next slot must go
    on to the next timer waiting for the rate (before, nobody promoted the rate: the timer
    waiting for it also bars the key's queue, where the old pacer waits: neither ever ran.
    Found by the drained model)."""
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)  # t000 takes the rate's slot at 0
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(RATED, DEFAULT_GROUP, 0, "k1", -40)  # t001: the rate's pacer, at 100
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(RATED, DEFAULT_GROUP, 5, "k1", -30)  # t002 waits for the rate, ahead in k1
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(PLAIN, DEFAULT_GROUP, 9, "k1", -20)  # t003 holds k1 (ahead of both)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    wait(world, 50, l1)
    world.clock.boot_ms = world.clock.ms  # the server restarts (keeping every write)
    world.r.script_flush()
    wait(world, 50, l1)
    world.claim(l1, 5, 0, False)  # t001 at its slot, which came before the server's start
    world.start_due(l1)  # k1 is t003's: t001 waits for it
    holder = next(t for t, r in l1.executing.items() if r.timer_id == "t003")
    world.finish(l1, holder, "ok", 0)
    for token in list(l1.executing):
        world.finish(l1, token, "ok", 0)
    # the fixture drains: every timer must end


def test_a_keyed_timer_waiting_for_its_rate_keeps_its_place_in_its_keys_order(
        world: World) -> None:
    """The rate-wait FIFO rule: a timer of a key that waits for its rate limit (T9) is still
    ahead of the key's later timers (the order barrier, "r|…"): they wait behind it (before:
    a plain timer of the key took the slot the rated one gave up)."""
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)  # t000 takes the rate's slot at 0
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(RATED, DEFAULT_GROUP, 0, "k1", -40)  # t001: k1 free, the rate is not
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -30)  # t002: behind t001 in k1's order
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    drain(world, l1, 5)
    assert broken(world, "fifo") == []
    assert [world.timers[t].status for t in ("t000", "t001", "t002")] == ["done"] * 3


def promote_t004(world: World) -> tuple[VListener, VListener]:
    """Listeners l1 and l2; t000 of key k1 ends on l1, which has no room left: t004, which
    waited for k1, is promoted (T11: pending again, the key's slot kept for it)."""
    world.fenced = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)  # t000 holds k1
    for _ in range(3):  # t001 to t003: l1 has no room left when t000 ends
        world.schedule(PLAIN, DEFAULT_GROUP, 0, "", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -40)  # t004 waits for k1
    world.claim(l2, 5, 0, False)
    world.start_due(l2)
    holder = next(t for t, r in l1.executing.items() if r.timer_id == "t000")
    world.finish(l1, holder, "ok", 0)  # nobody takes t004 over: promoted, its slot kept
    return l1, l2


def test_a_promoted_timer_gives_its_kept_slot_to_one_ahead_that_came_since(
        world: World) -> None:
    """A slot kept for a promoted timer (T11) goes to a timer of the key ahead of it that
    came to wait before it was claimed (a higher priority): the promoted one waits in its
    place (before: it took the slot over the one ahead)."""
    l1, l2 = promote_t004(world)
    world.schedule(PLAIN, DEFAULT_GROUP, 5, "k1", -10)  # t005: ahead of t004 (priority)
    world.park(l2, 10)  # t005 waits for k1
    for _ in range(4):
        world.claim(l2, 5, 0, False)
        world.start_due(l2)
        for token in sorted(l2.executing):
            world.finish(l2, token, "ok", 0)
        wait(world, 10, l1, l2)
    assert broken(world, "fifo") == []
    assert world.timers["t004"].status == "done" and world.timers["t005"].status == "done"


def test_a_promoted_timer_ended_before_its_gate_lets_its_key_go_on(world: World) -> None:
    """A promoted timer (T11: its key's slot kept for it) whose run ends before its gate
    (T28: its task missed its max lateness or was refused, or its run had ended in a
    process now gone) gives the kept slot on: the key's later timer runs (before: the slot
    held the key, and the key ran nothing more; the chaos checker's seed 63)."""
    _, l2 = promote_t004(world)
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -30)  # t005, behind t004
    world.claim(l2, 5, 0, False)
    promoted = next(t for t, (r, _) in l2.claimed.items() if r.timer_id == "t004")
    world.end_before_gate(l2, promoted, "dead")
    drain(world, l2, 6)
    assert world.timers["t005"].status == "done"


@pytest.mark.parametrize("rated_run", ["handed", "next in line"])
def test_the_run_after_a_keyed_timer_held_for_its_rate_waits_behind_it(
        world: World, rated_run: str) -> None:
    """The rate-wait FIFO rule for a rated timer of a key that finish.lua handed to a listener
    holding the key's slot (a handoff, or a run next in line that got the slot when the run
    before it ended), with the key's next timer handed along as the run next in line after
    it: when its gate holds it for its rate, that run does not take the slot past it; it is
    handed back and waits behind it (before: the slot passed on to it, and the listener
    started it the moment the rated one was held)."""
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)  # t000 takes the rate's slot at 0
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -40)  # t001 holds k1
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    if rated_run == "next in line":
        world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -35)  # handed over when t001 ends
    for task in (RATED, PLAIN):  # the rated one, then one behind it in k1's order
        world.schedule(task, DEFAULT_GROUP, 0, "k1", -30)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # they wait for k1
    holder = next(t for t, r in l1.executing.items() if r.timer_id == "t001")
    world.finish(l1, holder, "ok", 0)  # the next one handed over, the one after it next in line
    if rated_run == "next in line":
        handed = next(t for t, r in l1.executing.items() if r.timer_id == "t002")
        world.finish(l1, handed, "ok", 0)  # the rated one gets the slot; the rate is busy
    assert broken(world, "fifo") == []
    drain(world, l1, 6)
    assert broken(world, "fifo") == [] and broken(world, "key_limit") == []
    assert all(t.status == "done" for t in world.timers.values()), world.log


def test_a_claimed_run_whose_lease_lapsed_keeps_its_place_in_its_keys_order(
        world: World) -> None:
    """The order barrier counts a claimed run whose lease lapsed until a claim recovers it
    or it ends: its listener (stalled past its lease) may renew it (T19) and gate it. Found
    by the model: a keyed timer parked while the earlier claimed run had lapsed was promoted
    past it (the barrier dropped it as lapsed), its listener renewed it, and the promoted
    timer took the key's slot by screen while the earlier one, held again, waited."""
    world.fenced = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 5, "k1", 20)  # t000: due after t001
    world.schedule(RATED, DEFAULT_GROUP, 5, "k1", 0)  # t001: first in k1's order
    world.claim(l2, 5, 0, False)  # t001 claimed, not gated yet (rated: no screen)
    wait(world, 1500)  # l2 stalls past its lease; nobody claims
    world.park(l1, 10)  # t000 waits for k1, behind t001's lapsed run
    world.renew_all(l2)  # l2 goes on: t001's lapsed run is its own again
    world.claim(l1, 5, 0, False, screen=True)  # t000, if promoted, takes k1 by screen
    assert broken(world, "fifo") == []
    for _ in range(6):
        for listener in (l1, l2):
            world.claim(listener, 5, 0, False)
            world.start_due(listener)
            for token in sorted(listener.executing):
                world.finish(listener, token, "ok", 0)
        wait(world, 50, l1, l2)
    assert broken(world, "fifo") == [] and broken(world, "key_limit") == []
    assert [world.timers[t].status for t in ("t000", "t001")] == ["done"] * 2, world.log


def test_a_run_next_in_line_whose_lease_lapsed_still_takes_the_slot_over(
        world: World) -> None:
    """A run next in line whose lease lapsed (its listener stalled) is still its listener's
    until a claim recovers it: when the run before it ends, the slot passes to it (and to
    its rerun, if a claim recovers it), not to the key's later timers. Found by the model
    (seed 6): the slot went to the head of the key's queue as a handoff, the stalled
    listener renewed the run next in line and its gate held it behind the later ones."""
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)  # t000 holds k1
    world.schedule(RATED, DEFAULT_GROUP, 0, "k1", -40)  # t001: handed over when t000 ends
    world.schedule(RATED, DEFAULT_GROUP, 0, "k1", -30)  # t002: next in line after t001
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -20)  # t003, t004: behind them
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -10)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # t000 goes, the others wait for k1
    holder = next(t for t, r in l1.executing.items() if r.timer_id == "t000")
    world.finish(l1, holder, "ok", 0)  # t001 handed over (it goes), t002 next in line
    wait(world, 1500)  # l1 stalls past its leases; nobody claims
    rated = next(t for t, r in l1.executing.items() if r.timer_id == "t001")
    world.finish(l1, rated, "ok", 0)  # t002 renewed and gated: it must have the slot
    assert broken(world, "fifo") == []
    drain(world, l1, 6)
    assert broken(world, "fifo") == [] and broken(world, "key_limit") == []
    assert all(t.status == "done" for t in world.timers.values()), world.log


def test_a_lapsed_run_next_in_line_goes_back_in_its_place_when_the_run_before_it_is_held(
        world: World) -> None:
    """T22 with a lapsed lease: a rated run handed over holding its key's slot, with the
    key's next timer as the run next in line after it; its listener stalls past their
    leases between reading that reply and gating them (nobody claims meanwhile), then
    gates the rated one, which its rate holds (another timer paces it). The run next in
    line must go back into the key's queue in its place, its listener dropping it
    unstarted. Before, take_back_next left it claimed, lapsed, in neither the key's queue
    nor the order barrier: the key's slot went to the later timer behind it."""
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)  # t000 takes the rate's slot at 0
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -40)  # t001 holds k1
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -45)  # t002 paces the rate (its next slot)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.schedule(RATED, DEFAULT_GROUP, 0, "k1", -30)  # t003: handed over when t001 ends
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -20)  # t004: next in line after it
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -10)  # t005: behind them
    world.claim(l1, 5, 0, False)
    world.start_due(l1)  # they wait for k1
    holder = next(t for t, r in l1.executing.items() if r.timer_id == "t001")
    world.finish(l1, holder, "ok", 0, gate=False)  # t003 handed over, t004 next in line
    wait(world, 1500)  # l1 stalls past their leases before it gates t003; nobody claims
    world.start_due(l1)  # t003 (renewed: nobody recovered it) is held for its rate
    for _ in range(2):  # claims by event, one run each (no room left to recover a run):
        world.claim(l1, 1, 0, True)  # the pacer t002, then t003 at the slot it paces for
        world.start_due(l1)
        for token in sorted(l1.executing):
            world.finish(l1, token, "ok", 0)  # t003 ends: k1's slot goes on
        wait(world, 100, l1)
    drain(world, l1, 8)
    assert broken(world, "fifo") == [] and broken(world, "key_limit") == []
    assert all(t.status == "done" for t in world.timers.values()), world.log


def test_a_run_next_in_line_after_a_recovered_run_waits_behind_its_rerun(
        world: World) -> None:
    """A run holding its key's slot, with the key's next timer as the run next in line
    after it; its listener stalls past both leases, then a claim recovers the first run:
    its rerun takes the slot over. The run next in line goes back into the key's queue,
    behind the rerun, and when the paused first run's task returns it does not follow it
    into a start. Before, it stayed claimed and leased to its listener with no slot to
    follow, and started as the paused task returned, while the rerun ran: two runs of a
    key of limit 1 at once (found by the model test)."""
    world.fenced = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)  # t000 holds k1
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -40)  # t001: handed over as t000 ends
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -30)  # t002: next in line after t001
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    (first,) = l1.executing
    world.finish(l1, first, "ok", 0)
    (paused,) = l1.executing  # t001's run; t002's is next in line after it
    assert l1.executing[paused].timer_id == "t001" and l1.nexts, world.log
    wait(world, 1500)  # l1 stalls past both leases
    world.claim(l1, 1, 0, False)  # ... and then recovers t001's run itself: a rerun
    world.start_due(l1)
    assert any(r.timer_id == "t001" and t != paused for t, r in l1.executing.items()), \
        world.log
    wait(world, 300, l1)
    world.finish(l1, paused, "ok", 0)  # the paused task returns, late
    for token in sorted(l1.executing):
        world.finish(l1, token, "ok", 0)
    drain(world, l1, 8)
    assert broken(world, "key_limit") == [] and broken(world, "fifo") == [], world.log
    assert all(t.status == "done" for t in world.timers.values()), world.log



def test_a_claim_recovers_only_a_lapsed_lease(world: World) -> None:
    """T5 only for a lease the model reckons lapsed: 400 ms of it left is not."""
    world.fenced = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    wait(world, 600, l2)  # l1 stalls 600 ms: 400 ms of its lease left
    world.claim(l2, 5, 0, False)
    world.start_due(l2)
    assert broken(world, "stolen") == [] and broken(world, "twice") == []


def test_a_run_starts_only_with_a_tenth_of_its_lease_to_spare(world: World) -> None:
    """The fence (``Fence.fresh``): a run whose lease is known to hold 80 ms yet (a lease is
    1 s) is revalidated in Redis before it starts, not started as it is."""
    world.local_fence = True
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "", 920)
    world.claim(l1, 5, 1000, False)  # claimed 920 ms ahead of its due time
    world.renew_all(l1)  # its lease known to hold for 1 s from now
    world.clock.ms += 920  # l1 stalls until its due time: no renewal since
    world.start_due(l1)
    assert broken(world, "fenced") == [] and l1.executing, world.log


# -- the process topology (docs/state-machine.md, "Who holds a run") ----------------------


def test_a_rerun_queued_for_a_child_while_its_lease_lapses_does_not_start(
        world: World) -> None:
    """A rerun passes its parent's fence and is queued for a quarantine child; the parent
    stalls while the child loads, its lease lapses and another listener's claim reruns it
    (a newer token), which starts. The old child must then not start it: a run starts only
    while its lease is held, checked at the start in whichever process starts it."""
    assert child_checks_fence()
    world.local_fence, world.child_delay = True, True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.kill(l1)  # its first run dies with it
    wait(world, 1100, l2)
    world.claim(l2, 5, 0, False)
    world.start_due(l2)  # the rerun (reruns 1) passes the fence: queued for a child
    assert l2.children, world.log
    wait(world, 1100)  # l2 stalls while its child loads
    l3 = world.spawn((DEFAULT_GROUP,))
    world.claim(l3, 5, 0, False)  # the rerun's rerun (reruns 2)
    world.start_due(l3)
    for token in list(l3.children):
        world.child_start(l3, token)  # starts
    for token in list(l2.children):
        world.child_start(l2, token)  # the older one, after it
    assert broken(world, "fenced") == [] and broken(world, "older_token") == []


@pytest.mark.no_drain
def test_a_rated_rerun_that_waits_for_its_child_keeps_its_rates_interval(
        world: World) -> None:
    """A rated rerun is queued for a quarantine child, which loads for 100 ms while another
    timer of the rate passes its gate and starts. The rerun must not then start at once
    beside it (found by the random histories once the model's children started later
    than their parent's gate): its gate is asked once the child has loaded, right before
    the start, and holds it back an interval."""
    world.local_fence, world.child_delay = True, True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(RATED, DEFAULT_GROUP, 0, "", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.kill(l1)
    wait(world, 1100, l2)
    world.claim(l2, 5, 0, False)
    world.start_due(l2)  # the rerun: gated (its rate slot), queued for a child
    (rerun,) = l2.children
    world.schedule(RATED, DEFAULT_GROUP, 0, "", 0)
    wait(world, 100, l2)
    world.claim(l2, 5, 0, False)
    world.start_due(l2)  # gated an interval after the rerun, starts
    world.child_start(l2, rerun)  # the child has loaded: the rerun starts now
    assert broken(world, "rate") == [], world.log


def test_a_pause_of_the_parent_while_its_child_runs_ends_as_a_late_finish(
        world: World) -> None:
    """A rerun runs in a quarantine child; its parent is stopped past the lease (the child
    goes on: a process of its own), another listener reruns it. The child's run overlaps
    the new one, the one exception to a key's limit, and its ending is a late finish: the
    timer ends once."""
    world.local_fence = True
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -50)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    world.kill(l1)
    wait(world, 1100, l2)
    world.claim(l2, 5, 0, False)
    world.start_due(l2)  # the rerun runs in l2's child
    (in_child,) = l2.in_child
    wait(world, 1100)  # l2 (the parent) stopped; its child goes on
    l3 = world.spawn((DEFAULT_GROUP,))
    world.claim(l3, 5, 0, False)
    world.start_due(l3)
    world.finish(l2, in_child, "ok", 0)  # the child's task returns: a late finish
    for token in list(l3.executing):
        world.finish(l3, token, "ok", 0)
    assert broken(world, "key_limit") == [] and broken(world, "ending") == []
    assert world.timers["t000"].status == "done" and world.timers["t000"].ended == 1


def test_pauses_are_not_deaths(world: World) -> None:
    """Three listeners in turn stopped past the lease while they run a timer, none dies:
    the timer must not end dead for crashes (only an observed death counts toward
    ``max_crashes``)."""
    world.local_fence = True
    listener = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "", -50)
    world.claim(listener, 5, 0, False)
    world.start_due(listener)
    for _ in range(POLICY.max_crashes):
        listener.paused = True  # stopped past its lease, alive
        wait(world, 1100)
        listener = world.spawn((DEFAULT_GROUP,))
        world.claim(listener, 5, 0, False)
        world.start_due(listener)
    for token in list(listener.executing):
        world.finish(listener, token, "ok", 0)
    assert broken(world, "dead_without_death") == [], world.log
    assert world.timers["t000"].status == "done", world.log


def test_a_rerun_whose_quarantine_children_die_ends_dead_at_the_limit(world: World) -> None:
    """A poison: its listener is killed (a lapse, no crash), and its rerun kills each
    quarantine child it runs in. The parent sees each death, keeps the lease and runs it
    again in a new child under the same token (no claim in between) until the deaths
    reach ``max_crashes``; then the timer ends dead, once."""
    world.local_fence = True
    l2 = rerun_elsewhere(world, PLAIN)
    timer = world.timers["t000"]
    (token,) = l2.in_child
    for died in range(1, POLICY.max_crashes + 1):
        assert timer.status == "live" and l2.in_child == {token}, world.log
        world.kill_child(l2, token)
        assert l2.child_deaths.get(token, POLICY.max_crashes) == died
        wait(world, 100, l2)
    assert timer.status == "dead" and timer.crash_dead and timer.ended == 1, world.log
    assert world.violations == [], world.log


def test_a_run_whose_task_returned_is_not_run_again_when_its_process_dies(
        world: World) -> None:
    """A run's task returns; its process dies before the ending is written (a poison in
    another thread, a batch on its way). The run must not run again: its ending is durable
    before the process that ran it can lose it."""
    world.local_fence = True
    rerun_elsewhere(world, PLAIN, cut=World.die_unwritten)
    assert broken(world, "twice") == [], world.log


def test_a_run_still_going_when_its_listener_stops_is_counted_when_it_runs_again(
        world: World) -> None:
    """SIGTERM past the shutdown timeout: the listener hands back a run whose task is still
    going (``Lane.drain``) and exits with it. Its next start is a rerun, counted (before:
    handed back as an unstarted run is, it ran again as a first run)."""
    world.local_fence = True
    l2 = rerun_elsewhere(world, PLAIN, cut=World.stop)
    assert [run.reruns for run in l2.executing.values()] == [1], world.log
    assert world.violations == [], world.log


def test_a_run_handed_back_unstarted_is_not_a_rerun(world: World) -> None:
    """A run handed back before it started (its listener stopping, or out of memory)
    comes back as it was: its next start is its first, outside quarantine."""
    l1 = world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "", -50)
    world.claim(l1, 5, 0, False)
    (token,) = list(l1.claimed)
    world.hand_back(l1, token)
    world.claim(l1, 5, 0, False)
    world.start_due(l1)
    assert [run.reruns for run in l1.executing.values()] == [0], world.log
    assert world.violations == [], world.log


# -- the random histories ------------------------------------------------------------------
# After the scenarios (so that ``-x`` stops at a broken scenario in seconds). The default
# run: every invariant against the fenced listener the design asks for and against the
# listener as ``timers/listener`` has it (its real fence asks Redis only after a stall), the
# rate's through restarts that lose writes, and "nothing lost" on its own. Each history
# ends drained (``FlowModel.teardown``).

TestNothingLost = model(("lost", "cancelled_ran", "stuck"), fenced=True, shrink=LONG)
TestInvariants = model(KINDS, fenced=True, shrink=LONG)
TestRateThroughLostWrites = model(("rate",), fenced=True, lossy=True, shrink=LONG)
TestTodaysListener = model(KINDS, local_fence=True, shrink=LONG)
"""The listener as ``timers/listener`` has it: its own fence (``Fence``) asks Redis only
after a stall."""

# The long profile: one family of invariants per test, each shrinking to its own
# counterexample (``-m model_long`` or TIMERS_MODEL_LONG=1; ``.ci/run`` runs it with
# TIMERS_MODEL_LONG_EXAMPLES=60). Every one is expected to pass: a failure fails the run.
def _long(kinds: tuple[str, ...], local_fence: bool = False) -> type:
    case = model(kinds, fenced=not local_fence, long=True, local_fence=local_fence)
    return pytest.mark.model_long(case)


TestLongFenced = _long(("fenced", "older_token", "stolen", "revived", "ending"),
                       local_fence=True)
TestLongKeyLimit = _long(("key_limit",))
TestLongFifo = _long(("fifo",))
TestLongRate = _long(("rate",))
TestLongEarly = _long(("early",))
TestLongOnce = _long(("uncounted", "twice", "stuck"), local_fence=True)
TestLongNothingLost = _long(("lost", "cancelled_ran", "stuck"))


def test_a_keyed_run_handed_back_before_its_gate_keeps_its_place_in_its_keys_order(
        world: World) -> None:
    """T17 of a claimed keyed timer not gated yet (its listener stops, or loses Redis
    around the gate): it is pending again, and a later timer of its key that waited behind
    it in the order barrier must keep waiting until it is claimed again (before, the
    hand-back dropped its barrier note and the later one got the key first. Found by the
    chaos checker on Cluster, a listener recycling)."""
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -20)  # t000
    world.claim(l1, 1, 0, False)
    world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", -10)  # t001, behind it
    world.claim(l2, 1, 0, False)
    world.start_due(l2)  # barred by t000: waits in k1's queue
    (token,) = l1.claimed
    world.hand_back(l1, token)
    world.claim(l2, 1, 0, False)  # one free slot: the first timer its claim meets
    world.start_due(l2)
    assert not broken(world, "fifo")


def test_a_keyed_run_handed_back_holding_its_slot_keeps_its_place_and_its_next_in_line(
        world: World) -> None:
    """T17 of a run handed over holding its key's slot, with a run next in line after it
    (a stopping listener hands both back unstarted): both keep their places ahead of the
    key's later timers (before, the slot went to the key's queue and both went back to
    the due index behind it)."""
    l1, l2 = world.spawn((DEFAULT_GROUP,)), world.spawn((DEFAULT_GROUP,))
    for in_ms in (-40, -30, -20, -10):  # t000 .. t003
        world.schedule(PLAIN, DEFAULT_GROUP, 0, "k1", in_ms)
    world.claim(l1, 1, 0, False)
    world.start_due(l1)  # t000 holds k1
    world.claim(l2, 3, 0, False)
    world.start_due(l2)  # t001 .. t003 wait in k1's queue
    (first,) = l1.executing
    world.finish(l1, first, "ok", 0, gate=False)  # t001 handed over, t002 next in line
    for token in list(l1.claimed) + list(l1.nexts):
        world.hand_back(l1, token)
    world.claim(l2, 1, 0, False)  # one free slot: the first timer its claim meets
    world.start_due(l2)
    assert not broken(world, "fifo")
