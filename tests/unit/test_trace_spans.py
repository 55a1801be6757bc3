"""Traces across the delay (the ``otel`` extra): the span that schedules a timer is stored
with it (a W3C ``traceparent``), and each run, a day of the test's clock later, is a span
of its own linked to it, with the timer's id, task, attempt and lateness; a retry is a
span of its own, linked the same way. Read with the OpenTelemetry SDK's in-memory
exporter, through the real listener (``timers.testing``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "opentelemetry.sdk",
    reason="the OpenTelemetry SDK is not installed (pip install -e '.[dev]' brings it)",
)

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import timers
from tests.unit.conftest import ROOT, SAMPLE_TASKS
from timers.model.encoding import Record
from timers.model.trace import parse_traceparent
from timers.testing import TimersTest

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())  # once per process (the API's rule)
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    if not getattr(provider, "_timers_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        provider._timers_test_exporter = True  # type: ignore[attr-defined]
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def runs(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("timers.run ")]


def test_a_run_a_day_later_is_a_span_linked_to_the_request_that_scheduled_it(
        spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("app")
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as t:
        with tracer.start_as_current_span("POST /reminders") as request:
            tid = timers.schedule("mod.add", [1, 2], in_=86400)
        t.advance(days=1)
        t.run_due()
    (run,) = runs(spans)
    scheduled = request.get_span_context()
    assert [(link.context.trace_id, link.context.span_id) for link in run.links] == [
        (scheduled.trace_id, scheduled.span_id)]
    assert run.context.trace_id != scheduled.trace_id  # a trace of its own
    assert run.name == "timers.run mod.add" and run.kind == trace.SpanKind.CONSUMER
    attributes = dict(run.attributes or {})
    assert attributes["timers.timer_id"] == tid and attributes["timers.task"] == "mod.add"
    assert attributes["timers.attempt"] == 1 and attributes["timers.outcome"] == "ok"
    assert 0 <= float(attributes["timers.lateness_ms"]) < 60_000  # type: ignore[arg-type]
    assert run.start_time is not None and run.end_time is not None
    assert run.start_time <= run.end_time


def test_a_retry_is_a_span_of_its_own_linked_to_the_same_request(
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    tracer = trace.get_tracer("app")
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as t:
        with tracer.start_as_current_span("POST /jobs") as request:
            timers.schedule("ctx.fails_once", [str(tmp_path / "notes")], in_=60)
        t.advance(minutes=1)
        t.run_all()
    first, second = sorted(runs(spans), key=lambda s: s.attributes["timers.attempt"])  # type: ignore[index]
    scheduled = request.get_span_context().span_id
    assert [link.context.span_id for link in first.links] == [scheduled]
    assert [link.context.span_id for link in second.links] == [scheduled]
    assert (first.attributes or {})["timers.outcome"] == "retried"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert "first attempt fails" in (first.status.description or "")
    assert [e.name for e in first.events] == ["exception"]
    assert (second.attributes or {})["timers.attempt"] == 2
    assert second.status.status_code != trace.StatusCode.ERROR


def test_without_a_current_span_nothing_is_stored_and_the_run_links_nowhere(
        spans: InMemorySpanExporter) -> None:
    with TimersTest(SAMPLE_TASKS, search_path=str(ROOT)) as t:
        timers.schedule("mod.add", [1, 2], in_=0)
        t.run_due()
        assert [f.trace for f in t.ran()] == [None]
    (run,) = runs(spans)
    assert list(run.links) == []


def test_a_record_with_a_traceparent_reads_as_any_other_option() -> None:
    """A listener that does not know the option (an older release, or one without the
    extra) decodes the record, and keeps the option as it is when it retries it."""
    value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    record = Record.decode(f"mod.add;a=1;tp={value}:[1,2]")
    assert record.options == {"a": "1", "tp": value} and record.args == [1, 2]
    assert Record.decode(record.encode()) == record
    assert parse_traceparent(value) == (0x4bf92f3577b34da6a3ce929d0e0e4736,
                                        0x00f067aa0ba902b7, 1)


@pytest.mark.parametrize("value", [
    None, "", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-4bf9-00f0-01"])
def test_a_traceparent_that_is_not_one_links_nowhere(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_rerun_after_its_listener_died_is_a_span_of_its_own_linked_to_the_request(
        spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener that held the timer died mid-run (its lease lapsed); another one reruns
    it (in quarantine: a stand-in here, unit tests start no process). The rerun is a span
    of its own, on the rerun path, linked to the request that scheduled the timer."""
    import fakeredis

    from tests.unit.helpers import run_burst
    from tests.unit.test_crashes import PAST, crash
    from timers import Timers
    from timers.listener.quarantine.parent import Quarantine
    from timers.model.keys import Keyspace
    from timers.model.runs import Outcome
    from timers.store.script_modes import register_all

    server = fakeredis.FakeServer()
    fake = fakeredis.FakeRedis(server=server)
    ks, scripts = Keyspace(), register_all(fake)
    with trace.get_tracer("app").start_as_current_span("POST /orders") as request:
        Timers(fake).schedule("mod.add", [1, 2], at=PAST, id="cut")
    crash(fake, ks, scripts, "web-1:101:ab")

    async def in_quarantine(*args: object) -> Outcome:
        return Outcome("ok", "", "")

    monkeypatch.setattr(Quarantine, "run", in_quarantine)

    run_burst(server)
    (rerun,) = runs(spans)
    attributes = dict(rerun.attributes or {})
    assert (attributes["timers.timer_id"], attributes["timers.path"],
            attributes["timers.outcome"]) == ("cut", "rerun", "ok")
    assert [link.context.span_id for link in rerun.links] == [
        request.get_span_context().span_id]
