"""A task's traceback as its author wants to read it: from the task's own frames.

A task that raises is called through timers' runner (and the thread pool or asyncio
machinery of the standard library), so the traceback Python formats starts with frames
no user can act on. :func:`from_task_frames` leaves the leading ones out, in each
traceback of a chain (``During handling of the above exception …``), and says how many
it left out; a traceback with no frame of the task's (an error raised by timers itself)
is kept whole.
"""

from __future__ import annotations

import os
import re
import sysconfig

_TIMERS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+')


def _machinery(path: str) -> bool:
    """A frame of timers' own code, or of the standard library (not site-packages)."""
    path = os.path.abspath(path) if path and not path.startswith("<") else path
    if path.startswith(_TIMERS_DIR):
        return True
    return path.startswith(_STDLIB_DIR) and "site-packages" not in path


def _frames(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The lines after a header, as (file, lines of that frame) up to the first line
    that is no frame's (the exception itself); a file of "" for that rest."""
    frames: list[tuple[str, list[str]]] = []
    for i, line in enumerate(lines):
        match = _FRAME.match(line)
        if match:
            frames.append((match["file"], [line]))
        elif frames and (line.startswith("    ") or line.startswith("  [")):
            frames[-1][1].append(line)
        else:
            frames.append(("", lines[i:]))
            break
    return frames


def from_task_frames(text: str) -> str:
    """``text`` (a formatted traceback) without its leading frames of timers and the
    standard library, in each traceback of a chain."""
    if _HEADER not in text:
        return text
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if lines[i].strip() != _HEADER:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == _HEADER),
                   len(lines))
        frames = _frames(lines[i + 1:end])
        calls = [f for f in frames if f[0]]
        skipped = 0
        while skipped < len(calls) and _machinery(calls[skipped][0]):
            skipped += 1
        if skipped == len(calls):  # no frame of the task's: keep them all
            skipped = 0
        if skipped:
            out.append(f"  [{skipped} frame(s) that called the task left out]")
        for _, frame_lines in frames[skipped:]:
            out.extend(frame_lines)
        i = end
    return "\n".join(out)
