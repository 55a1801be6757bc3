"""Tasks that fail."""

from __future__ import annotations


class TaskBroke(RuntimeError):
    """What :func:`boom` raises."""


def boom(tag: str) -> None:
    raise TaskBroke(f"boom {tag}")

