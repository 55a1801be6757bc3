"""Traces across the delay (``pip install 'redis-timers[otel]'``, OpenTelemetry): the
trace context of the code that schedules a timer, stored with it as a W3C ``traceparent``
(the record's ``tp`` option), so that each run's span can link to it
(:mod:`timers.listener.health.spans`).

Without ``opentelemetry-api`` installed, or with no valid span current where the timer is
scheduled, nothing is stored: the record is what it was without the extra."""

from __future__ import annotations

import re
import sys

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def traceparent() -> str | None:
    """The current span's context as a ``traceparent`` (``00-<trace>-<span>-<flags>``), or
    None: no valid span is current, or OpenTelemetry is not loaded (no span can be current
    then; it is never imported here, so a process that does not trace pays nothing)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    span = api.get_current_span()
    if span is api.INVALID_SPAN:  # (what it returns when no span is current: most calls)
        return None
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a stored ``traceparent``; None for none, or for one
    that is not version 00's form or has an all-zero id."""
    found = TRACEPARENT.fullmatch(value or "")
    if found is None:
        return None
    trace_id, span_id, flags = (int(part, 16) for part in found.groups())
    return (trace_id, span_id, flags) if trace_id and span_id else None
