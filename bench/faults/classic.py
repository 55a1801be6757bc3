"""The faults of the first fault table: kills, dropped subscriptions, Redis stalls."""

from __future__ import annotations

import contextlib
import signal
import time

import redis

from bench.faults.ledger import open_runs
from bench.faults.processes import FaultError, sleep_until, wait_for
from bench.faults.scenario import SUBSCRIPTION_LOST, Fault, Scenario


def subscription_losses(scenario: Scenario) -> int:
    return sum(listener.count_in_log(SUBSCRIPTION_LOST)
               for listener in scenario.listeners)


def inject_kill9(s: Scenario) -> None:
    victim = s.busiest_listener()
    running = len(open_runs(s.ledger, victim.pid))
    s.send(victim, signal.SIGKILL)
    victim.wait(10)
    s.evidence.append(f"killed listener {victim.pid} with {running} task(s) running on it")


def inject_client_kill(s: Scenario) -> None:
    killed = s.r.client_kill_filter(_type="pubsub")
    s.evidence.append(f"CLIENT KILL TYPE pubsub closed {killed} connection(s)")
    wait_for(lambda: subscription_losses(s) >= len(s.live_listeners()), 10,
             "the listeners to notice the lost subscription")


def inject_events_off(s: Scenario) -> None:
    s.r.config_set("notify-keyspace-events", "")
    time.sleep(3.0)  # the fault's duration, not a wait for an outcome
    s.r.config_set("notify-keyspace-events", "Ex")
    s.evidence.append("expired events off for 3 s")


def inject_restart(s: Scenario, down_s: float = 1.0) -> None:
    stopped = time.time()
    with contextlib.suppress(redis.ConnectionError):
        s.r.shutdown()  # writes the AOF; the server process exits
    sleep_until(stopped + down_s)
    s.server.restart()
    back = time.time()
    due_meanwhile = sum(1 for due in s.due_ms.values() if stopped * 1000 <= due <= back * 1000)
    s.evidence.append(f"Redis down {back - stopped:.2f} s; {due_meanwhile} timers came due "
                      f"meanwhile")


def inject_pause(s: Scenario) -> None:
    s.r.client_pause(3000)
    time.sleep(3.0)  # the fault's duration
    s.evidence.append("all clients paused 3 s")


def expire_together(r: redis.Redis, n: int, px: int, prefix: str = "filler") -> None:
    """``n`` keys outside the timers namespace that expire together in ``px`` ms, as an
    app's other keys may: each is an expired event for every listener all the same."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"{prefix}:{i}", 1, px=px)
    pipe.execute()


def inject_tiny_buffer(s: Scenario) -> None:
    old = str(s.r.config_get("client-output-buffer-limit")["client-output-buffer-limit"])
    before = subscription_losses(s)
    s.r.config_set("client-output-buffer-limit", "pubsub 1kb 512 1")
    expire_together(s.r, 2000, 500)  # with the timers' burst
    try:
        # the burst is due 0.5 s after this point: the server must drop the subscriptions
        wait_for(lambda: subscription_losses(s) > before, 10,
                 "the server to drop a subscription over its output buffer limit")
    finally:
        s.r.config_set("client-output-buffer-limit", old)
    s.evidence.append(f"the server dropped {subscription_losses(s) - before} "
                      f"subscription(s) (listener logs)")


def inject_sigstop(s: Scenario) -> None:
    """SIGSTOP the busiest listener past its lease (a VM freeze, a GC pause), then SIGCONT:
    the other takes its runs over; resumed, it may finish the run it was in (a second run
    the stop explains) but must start nothing it no longer holds (one that would not be)."""
    victim = s.busiest_listener()
    running = len(open_runs(s.ledger, victim.pid))
    sent = s.send(victim, signal.SIGSTOP)
    sleep_until(sent.at + 2 * s.lease)  # the pause: twice the lease
    victim.process.send_signal(signal.SIGCONT)
    s.evidence.append(f"stopped listener {victim.pid} with {running} task(s) running on it "
                      f"for {time.time() - sent.at:.1f} s (lease {s.lease:g} s)")


def inject_sigterm(s: Scenario) -> None:
    time.sleep(0.2)  # into the burst, which came due at the fault time
    victim = s.busiest_listener()
    running = len(open_runs(s.ledger, victim.pid))
    sent = s.send(victim, signal.SIGTERM)
    code = victim.wait(s.shutdown_timeout + 10)
    s.gone[victim.pid] = time.time()
    exited = s.gone[victim.pid] - sent.at
    handed = s.timers.stats().counters.get("handed_back", 0)
    s.evidence.append(f"SIGTERM to listener {victim.pid} with {running} task(s) running: "
                      f"it exited {code} after {exited:.2f} s and handed back {handed} run(s)")
    if code != 0:
        raise FaultError(f"the SIGTERMed listener exited {code}: {victim.last_words()}")
    s.start_listener()


CLASSIC_FAULTS: tuple[Fault, ...] = (
    Fault("kill9", "kill -9 one of two listeners mid-run", inject_kill9,
          slow_every=10, slow_seconds=1.5),
    Fault("client-kill", "CLIENT KILL TYPE pubsub", inject_client_kill),
    Fault("events-off", 'notify-keyspace-events "" for 3 s, then "Ex"', inject_events_off),
    Fault("restart", "Redis restart (AOF), down 1 s", inject_restart),
    Fault("pause", "CLIENT PAUSE 3000 (--lease 5)", inject_pause, lease=5.0),
    Fault("tiny-buffer", "pubsub output buffer 1kb + burst", inject_tiny_buffer,
          burst=True, burst_delay=0.5),
    Fault("sigterm", "SIGTERM one listener during a burst", inject_sigterm,
          slow_every=20, slow_seconds=3.0, burst=True, shutdown_timeout=1.0),
    Fault("sigstop", "SIGSTOP one listener past its lease, then SIGCONT", inject_sigstop,
          slow_every=10, slow_seconds=1.5),
)
EXTRA_FAULTS: tuple[Fault, ...] = (
    # Not in the default run: a stall longer than the lease lets other listeners (and
    # the same one) take over runs whose lease lapsed while nobody could renew it,
    # including runs that finished during the stall. Kept to measure that limit.
    Fault("pause-over-lease", "CLIENT PAUSE 3000 with --lease 2", inject_pause),
)
