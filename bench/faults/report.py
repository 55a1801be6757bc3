"""The results of a fault run as one Markdown table, then the evidence of each fault."""

from __future__ import annotations

from collections.abc import Sequence

from bench.faults.scenario import Result
from timers.model.percentiles import percentile


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"


def _row(res: Result) -> list[str]:
    main, final = res.main, res.final
    if main is None:
        return [res.fault, "-", "-", "-", "-", "-", "-", "-", "FAIL"]
    return [
        res.fault, f"{main.timers:,}", f"{main.fired:,}", str(len(main.lost)),
        f"{main.expected_duplicates} / {len(main.unexpected_duplicates)}",
        f"{_ms(percentile(main.lateness_ms, 99))} / "
        f"{_ms(max(main.lateness_ms, default=float('nan')))}",
        _ms(max(main.rerun_after_signal_ms, default=float("nan"))),
        "-" if final is None else
        f"{final.fired}/{final.timers}, "
        f"{_ms(max(final.lateness_ms, default=float('nan')))}",
        "pass" if res.ok else "FAIL",
    ]


def _notes(res: Result) -> str:
    notes = list(res.evidence)
    if res.main is not None and res.main.most_runs > 1:
        notes.append(f"most runs of one timer: {res.main.most_runs}")
    notes += [f"PROBLEM: {p}" for p in res.problems]
    for name, verdict in (("", res.main), ("final-batch ", res.final)):
        twice = list(dict.fromkeys(verdict.unexpected_duplicates)) if verdict else []
        if twice:
            notes.append(f"PROBLEM: unexpected second runs of {len(twice)} {name}timers: "
                         f"{', '.join(twice[:10])}{' …' if len(twice) > 10 else ''}")
        if verdict is not None and verdict.lost:
            notes.append(f"PROBLEM: lost {name}timers {', '.join(verdict.lost[:10])}"
                         f"{' …' if len(verdict.lost) > 10 else ''}")
    return f"- {res.fault} ({res.seconds:.0f} s): " + "; ".join(notes)


def table(results: Sequence[Result]) -> str:
    """The results as one Markdown table, then the evidence of each fault."""
    header = ("fault", "timers", "fired", "lost", "duplicate runs (expected / other)",
              "lateness p99 / max ms", "rerun after signal, max ms",
              "final batch: fired, max lateness ms", "result")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_row(res)) + " |" for res in results]
    lines.append("")
    lines += [_notes(res) for res in results]
    return "\n".join(lines)
