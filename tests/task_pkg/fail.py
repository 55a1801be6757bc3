"""Tasks that fail."""

from __future__ import annotations


class TaskBroke(RuntimeError):
    """What :func:`boom` raises."""


def boom(tag: str) -> None:
    raise TaskBroke(f"boom {tag}")


def takes_one(tag: str) -> None:
    """Fine when called with one positional arg; a timer with other args fails to bind."""
    raise AssertionError(f"takes_one must never run in the tests, got {tag!r}")
