"""A listener's metrics count every run exactly, buckets included, once flushed."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from timers.listener.endings.ending import Ending, Executed
from timers.model.runs import OK, Fired, Outcome
from timers.model.wire import EndingKind
from timers.observe.listener_metrics import ListenerMetrics


def run(kind: EndingKind, lateness_ms: float, source: str = "sweep",
        task: str = "mail.send") -> Executed:
    outcome = OK if kind == EndingKind.OK else Outcome("error", "Boom", "boom")
    report = Fired("t", task, 1000, 1000 + lateness_ms, 1000 + lateness_ms + 20, source, 1,
                   outcome, "video")
    return Executed(Ending("tok", kind), report)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_runs_are_counted_by_outcome_path_and_bucket_once_flushed() -> None:
    registry = CollectorRegistry()
    metrics = ListenerMetrics(registry)
    for lateness in (0.05, 0.05, 0.3, 2.0):
        metrics.ended(run(EndingKind.OK, lateness))
    metrics.ended(run(EndingKind.FAIL, 40.0, source="recovered"))
    metrics.ended(run(EndingKind.RETRY, 0.05, source="event"))
    metrics.ended(Executed(None, None))  # held back by a flow gate: not a run
    assert samples(registry).get(("timers_runs_total", ())) is None  # nothing flushed yet
    metrics.flush()
    metrics.flush()  # a second flush adds nothing
    got = samples(registry)
    runs = {k[1]: v for k, v in got.items() if k[0] == "timers_runs_total"}
    assert runs == {(("group", "video"), ("outcome", "ok"), ("task", "mail.send")): 4,
                    (("group", "video"), ("outcome", "dead"), ("task", "mail.send")): 1,
                    (("group", "video"), ("outcome", "retried"), ("task", "mail.send")): 1}
    assert got[("timers_started_total", (("path", "rerun"),))] == 1
    assert got[("timers_started_total", (("path", "event"),))] == 1
    assert got[("timers_reruns_total", (("group", "video"), ("task", "mail.send")))] == 1
    late = {k[1][1][1]: v for k, v in got.items() if k[0] == "timers_lateness_seconds_bucket"}
    assert (late["0.0001"], late["0.0005"], late["0.0025"], late["0.05"], late["+Inf"]) == (
        3, 4, 5, 6, 6)
    assert got[("timers_lateness_seconds_count", (("group", "video"),))] == 6
    assert abs(got[("timers_lateness_seconds_sum", (("group", "video"),))] - 0.04245) < 1e-9


def test_the_sampler_sets_the_gauges_and_flushes_runs_as_the_listener_runs_and_stops() -> None:
    registry = CollectorRegistry()
    metrics = ListenerMetrics(registry)
    metrics.ended(run(EndingKind.OK, 0.05))

    async def first_pass() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        stopping = asyncio.Event()
        sampler = asyncio.create_task(metrics.sample(lambda: 3, lambda: 29, stopping))
        await asyncio.sleep(0)  # the sampler's first pass, before any stop
        seen = samples(registry)
        metrics.ended(run(EndingKind.OK, 0.05))  # ended as the listener stops
        stopping.set()
        await sampler
        return seen

    seen = asyncio.run(first_pass())
    ok = ("timers_runs_total", (("group", "video"), ("outcome", "ok"), ("task", "mail.send")))
    assert seen[("timers_running", ())] == 3
    assert seen[("timers_free_slots", ())] == 29
    assert seen[ok] == 1
    assert samples(registry)[ok] == 2, "a run that ended as the listener stopped is counted"
