"""The journals of this host's other listeners of a prefix (:mod:`timers.listener.endings.journal`):
adopting those whose processes died (:class:`DeadJournal`, their endings written by the
adopter), and finding how an earlier run of a timer ended in any of them
(:meth:`HostJournals.ending_of`), so a rerun of a run that had ended is ended the same way,
not run again. Read on the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from timers.listener.endings.ending import Ending
from timers.listener.endings.journal_format import (
    ADOPTED,
    ASIDE,
    ROTATING,
    SUFFIX,
    Contents,
    file_name,
    open_locked,
    parse,
    read_text,
)
from timers.model.run_record import decode
from timers.model.runs import Run

log = logging.getLogger("timers.listener")

KEEP_ASIDE = 30
"""Leases a line a quarantine child noted aside is kept when its listener did not take it
up (it died first): a rerun of the run, on this host, ends the same way meanwhile."""
KEEP_ADOPTED = 2
"""Leases an adopted journal is kept, for a run of it recovered meanwhile elsewhere on
this host (:meth:`HostJournals.ending_of`)."""


class HostJournals:
    """The journal directory of one prefix and server on this host, as read by the
    listener whose own journal is ``own``."""

    def __init__(self, directory: Path, own: Path, lease: float) -> None:
        self.directory, self.own, self.lease = directory, own, lease

    def dead(self) -> list[DeadJournal]:
        """The journals of this directory whose processes are gone, each locked by this
        one until :meth:`DeadJournal.adopted` or :meth:`DeadJournal.release`. Adopted ones
        older than :data:`KEEP_ADOPTED` leases are deleted on the way."""
        found = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            path = self.directory / name
            if name.endswith(ROTATING):
                _delete_if_unlocked(path)
            elif name.endswith(ADOPTED) or (SUFFIX + ASIDE) in name:
                keep = KEEP_ADOPTED if name.endswith(ADOPTED) else KEEP_ASIDE
                with contextlib.suppress(OSError):
                    if time.time() - os.lstat(path).st_mtime > keep * self.lease \
                            and not _own_aside(path, self.own):
                        os.unlink(path)
            elif name.endswith(SUFFIX) and path != self.own:
                dead = DeadJournal.lock(path)
                if dead is not None:
                    found.append(dead)
        return found

    def ending_of(self, died_on: str | None, lane: int, run: Run) -> Ending | None:
        """How listener ``died_on`` ended an earlier run of ``run``'s timer (same id and
        due time) when it is in its journal on this host (adopted or not), else None.
        ``died_on`` None: any listener's journal on this host (a rerun that went back into
        its key's queue: which listener ran it before is not known)."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return None
        if died_on is not None:
            path = self.directory / file_name(died_on)
            candidates = [path, path.with_name(path.name + ADOPTED)] + [
                self.directory / name for name in names
                if name.startswith(path.name + ASIDE)]
        else:
            candidates = [self.directory / name for name in names
                          if name.endswith((SUFFIX, SUFFIX + ADOPTED)) or SUFFIX + ASIDE in name]
        for candidate in candidates:
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                text = read_text(fd)
            except OSError:
                continue
            finally:
                os.close(fd)
            wanted = (run.escaped_id, run.due_ms)
            for ending in reversed(list(parse(text).endings.get(lane, {}).values())):
                if ending.run_of == wanted:
                    return ending
        return None


def _own_aside(path: Path, journal: Path) -> bool:
    """Whether ``path`` is a line noted aside for this listener's own journal ``journal``
    (it goes when the ending is journaled: :meth:`Journal.ending`)."""
    return path.name.startswith(journal.name + ASIDE)


def _delete_if_unlocked(path: Path) -> None:
    """A rotation cut short by its process's death: its content is still in the journal."""
    try:
        fd = open_locked(path, 0)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


class DeadJournal:
    """The journal of a process that is gone, locked by this one."""

    def __init__(self, path: Path, fd: int, contents: Contents) -> None:
        self.path, self.fd, self.contents = path, fd, contents

    @classmethod
    def lock(cls, path: Path) -> DeadJournal | None:
        """``path``'s journal when its process is gone (its lock can be taken and the path
        still names the file locked), else None."""
        try:
            fd = open_locked(path, 0)
        except OSError:
            return None  # its process lives (or it is gone already)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or os.stat(path).st_ino != info.st_ino:
                raise OSError("replaced")
            text = read_text(fd)
        except OSError:
            os.close(fd)
            return None
        contents = parse(text)
        if contents.skipped > 1:
            log.warning("endings journal %s: %d line(s) did not read and were skipped", path,
                        contents.skipped)
        return cls(path, fd, contents)

    def held_by_owner(self, lane: int, records: list[Any]) -> list[Ending]:
        """Of this journal's endings in ``lane``, those whose runs are still leased, as
        ``records`` say (the running records of their tokens, in order): a run of the
        same timer and due time (a token names one run for ever), or for an ending that
        does not say which run (a hand-back), one its owner claimed. (An adopter that
        died journaled the endings it adopted: the runs are another listener's then.)"""
        owner = self.contents.owner
        endings = list(self.contents.endings.get(lane, {}).values())
        out = []
        for ending, record in zip(endings, records, strict=True):
            if record is None:
                continue
            try:
                _, listener, due, escaped, _ = decode(
                    record.decode() if isinstance(record, bytes) else record)
            except (ValueError, UnicodeDecodeError):
                continue
            if ending.run_of == (escaped, due) or (ending.run_of is None
                                                   and listener == owner):
                out.append(ending)
        return out

    def tokens(self, lane: int) -> list[str]:
        """The run tokens of this journal's endings in ``lane``."""
        return list(self.contents.endings.get(lane, {}))

    def adopted(self) -> None:
        """Its endings are in this process's hands: renamed ``….adopted``, kept a while
        (for a run recovered meanwhile), then deleted by a later look."""
        adopted = self.path.with_name(self.path.name + ADOPTED)
        with contextlib.suppress(OSError):
            os.rename(self.path, adopted)
            os.utime(adopted)
        self.release()

    def release(self) -> None:
        os.close(self.fd)
