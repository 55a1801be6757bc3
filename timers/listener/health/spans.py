"""Each run an OpenTelemetry span (``pip install 'redis-timers[otel]'``), linked to the span
that scheduled the timer (its stored ``traceparent``, :mod:`timers.model.trace`).

A run's span is made when the run ends, from what the listener reports of it
([`Fired`][timers.model.runs.Fired]: its start and end on the Redis clock, its timer, task,
attempt, lateness, the path that found it and how it ended), through the global tracer
provider the app configures (none: OpenTelemetry's no-op). It begins a trace of its own
and links to the scheduling span: a timer run a day later is not part of a request's
trace, and a retry or a rerun is a span of its own, linked the same way. The task's own
spans are not children of it (the span is made after the run)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from timers.model.trace import parse_traceparent
from timers.model.wire import ClaimSource, EndingKind

if TYPE_CHECKING:
    from timers.listener.endings.ending import Executed
    from timers.listener.health.tally import RunObserver

_ENDINGS = {EndingKind.OK: "ok", EndingKind.SKIP: "skipped", EndingKind.RETRY: "retried",
            EndingKind.FAIL: "dead"}
CHECK_EVERY = 1.0
"""Seconds between looks at whether a tracer provider is set."""
RERUN = ClaimSource.RECOVERED.label
"""A run taken over from a listener that died mid-run."""


class RunSpans:
    """A [`RunObserver`][timers.listener.health.tally.RunObserver] making a span of each run, once
    the process has OpenTelemetry loaded and a tracer provider set."""

    def __init__(self) -> None:
        self.trace: Any = None  # the opentelemetry.trace module, once loaded
        self.tracer: Any = None
        self._live, self._checked_until = False, 0.0

    def configured(self) -> bool:
        """Whether the process has set a tracer provider (an SDK's): looked at once a
        second at most, as asking costs more than the rest of a run's span. OpenTelemetry
        is never imported here: the app's code (its tasks package) loads and configures it."""
        now = time.monotonic()
        if now >= self._checked_until:
            self._checked_until = now + CHECK_EVERY
            api: Any = sys.modules.get("opentelemetry.trace")
            self._live = api is not None and not isinstance(
                api.get_tracer_provider(), (api.ProxyTracerProvider, api.NoOpTracerProvider))
            if self._live and self.tracer is None:
                self.trace, self.tracer = api, api.get_tracer("timers")
        return self._live

    def ended(self, done: Executed) -> None:
        """A run ended: its span, from its start to its end (nothing for a timer held back
        or handed back unrun)."""
        report, ending = done.report, done.ending
        if report is None or ending is None or ending.kind not in _ENDINGS:
            return
        if not self.configured():
            return  # no SDK (yet): spare the run the making of a no-op span
            # (figures: bench/FINDINGS.md, "A run's Python in the listener")
        trace = self.trace
        links = []
        parent = parse_traceparent(report.trace)
        if parent is not None:
            trace_id, span_id, flags = parent
            links.append(trace.Link(trace.SpanContext(
                trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags))))
        span = self.tracer.start_span(
            f"timers.run {report.task or '(unknown)'}", kind=trace.SpanKind.CONSUMER,
            links=links, start_time=int(report.started_ms * 1_000_000),
            attributes={"timers.timer_id": report.timer_id,
                        "timers.task": report.task or "(unknown)",
                        "timers.attempt": report.attempt,
                        "timers.lateness_ms": report.lateness_ms,
                        "timers.group": report.group,
                        "timers.path": "rerun" if report.source == RERUN else report.source,
                        "timers.outcome": _ENDINGS[ending.kind]})
        outcome = report.outcome
        if not outcome.ok and outcome.kind != "skipped":
            span.add_event("exception", {"exception.type": outcome.error_type,
                                         "exception.message": outcome.message,
                                         "exception.stacktrace": outcome.traceback})
            span.set_status(trace.Status(trace.StatusCode.ERROR,
                                         f"{outcome.error_type}: {outcome.message}"[:500]))
        span.end(end_time=int(report.finished_ms * 1_000_000))

    def handed_back_runs(self, n: int) -> None:
        """(Unfinished runs handed back at shutdown: their next run makes the span.)"""

    def rejected_key(self) -> None:
        """(An expired key that named no timer: no run.)"""


def observers() -> list[RunObserver]:
    """A listener's: a [`RunSpans`][timers.listener.health.spans.RunSpans]."""
    return [RunSpans()]
