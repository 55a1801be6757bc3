"""The endings journal: a run's ending is on local disk before its process can lose it.

A listener writes endings to Redis in batches (:mod:`timers.listener.endings.writer`), so a
process that dies (a task in one thread calls ``os._exit``, the OOM killer, ``kill -9``)
took with it the endings of runs that had finished but were not written yet: their leases
lapsed and they ran again. So each listener process copies every ending into a file of its
own, mapped into its memory, the moment its run ends: a plain task's in the thread that ran
it, right after its function returned; any other as it reaches the event loop. The kernel
keeps the pages of a shared file mapping whatever becomes of the process. The text is
emptied each time Redis has every ending in it (the file is replaced by one with the
unwritten ones only once its text passes :data:`ROTATE_BYTES`).

The files of one prefix and server (named by an id kept in the server:
:func:`server_identity`) share a private directory (0700, in
``$XDG_RUNTIME_DIR`` or the temp dir, or ``$TIMERS_ENDINGS_DIR``); each is held under an
exclusive ``flock`` by its live process. Any listener of that directory adopts the file
of a process that died (its lock can be taken), at start and every third of a lease: it
writes the endings of the runs still leased through its own writer (``finish.lua``) and
renames the file ``….adopted``, deleted a few leases later. A run recovered from a
listener on this host whose journal (adopted or not) holds its ending is ended that way,
not run again: that listener died, or stalled past its lease after the run ended. Reading
other listeners' journals: :mod:`timers.listener.endings.adoption`. A file is data: a line
that does not read is skipped (the names, lock and lines of a file:
:mod:`timers.listener.endings.journal_format`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import stat
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from timers.exceptions import JournalUnavailable
from timers.listener.endings.adoption import HostJournals
from timers.listener.endings.ending import Ending
from timers.listener.endings.journal_format import (
    ASIDE,
    ROTATING,
    completed_line,
    ending_line,
    file_name,
    open_locked,
)
from timers.model.encoding import as_text
from timers.model.runs import Run
from timers.model.wire import EndingKind

log = logging.getLogger("timers.listener")
_OK = EndingKind.OK  # read once: an enum member read off its class is slow, and each ending asks

DIR_ENV = "TIMERS_ENDINGS_DIR"
"""Where the journals go instead of ``$XDG_RUNTIME_DIR/timers`` or ``<tmp>/timers-<uid>``
(a directory per prefix and server is made in it)."""
MAP_BYTES = 1 << 20
"""The size a journal file is made with (sparse: only the pages written take room)."""
ROTATE_BYTES = MAP_BYTES // 2
"""A journal whose endings are never all written at once (a steady load) is replaced by
one with only the unwritten ones when its text grows past this."""


async def server_identity(client: Any, instance_key: str, prefix: str) -> str:
    """What names the prefix on its server, whatever address this process reaches it by
    (a proxy, a name or an IP, a replica promoted since): the random id kept at
    ``instance_key``, set by the first listener that asks. Its journals' directory is
    named after it. Listeners that reached one server by two addresses kept their
    journals apart, and a run ended in a process that died ran again (the chaos checker:
    a listener behind a proxy, 5 runs completed twice in 6 minutes)."""
    await client.set(instance_key, os.urandom(12).hex(), nx=True)
    return f"{as_text(await client.get(instance_key))} {prefix}"


def journal_directory(identity: str) -> Path:
    """The private directory of the journals of ``identity``'s listeners on this host,
    made if need be; :class:`JournalUnavailable` if it is not private to this user."""
    configured = os.environ.get(DIR_ENV)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if configured:
        root = Path(configured)
    elif runtime and os.path.isdir(runtime):
        root = Path(runtime) / "timers"
    else:
        root = Path(tempfile.gettempdir()) / f"timers-{os.getuid()}"
    directory = root / hashlib.sha256(identity.encode()).hexdigest()[:16]
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    except OSError as exc:
        raise JournalUnavailable(f"{exc.filename}: {exc.strerror}") from None
    # a directory of the user's choosing is theirs to keep; ours in a shared place is
    # checked too (another user could have made it, or a link of that name)
    for path in (directory,) if configured else (root, directory):
        _check_private(path)
    return directory


def _check_private(path: Path) -> None:
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise JournalUnavailable(f"{path}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise JournalUnavailable(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise JournalUnavailable(f"{path} belongs to uid {info.st_uid}, not {os.getuid()}")
    if info.st_mode & 0o077:
        raise JournalUnavailable(f"{path} is open to other users (mode "
                                 f"{stat.S_IMODE(info.st_mode):o}, needs 700)")


class Journal:
    """This process's journal (one per listener, shared by its lanes and threads).

    The file is mapped into memory: the kernel keeps the pages of a shared mapping when
    the process dies, and the text ends at its first NUL. A line is a copy into the
    mapping, made holding the GIL, with no system call: a ``write`` would let the GIL go,
    a hand-over of the interpreter per run that cost CPU on every fire
    (figures: bench/FINDINGS.md, "GIL hand-overs per run")."""

    def __init__(self, directory: Path, owner: str, lease: float = 15.0) -> None:
        self.directory, self.owner, self.lease = directory, owner, lease
        self.path = directory / file_name(owner)
        self._lock = threading.Lock()
        """Held for each copy into the map and each change of it (no system call while
        it is held but when the file is replaced)."""
        self._pending: dict[str, bytes] = {}
        """Run token -> its latest line, till Redis has its ending."""
        self._aside: set[str] = set()
        """Tokens of runs whose quarantine child may note their completion aside
        (:meth:`aside`), till their ending is journaled here."""
        self._header = b"H " + json.dumps(owner).encode() + b"\n"
        try:
            fd = open_locked(self.path, os.O_CREAT | os.O_EXCL)
        except OSError as exc:
            raise JournalUnavailable(f"{self.path}: {exc.strerror or exc}") from None
        try:
            self._map: mmap.mmap | None = _mapped(fd, self._header, MAP_BYTES)
        except OSError as exc:
            os.unlink(self.path)
            os.close(fd)
            raise JournalUnavailable(f"{self.path}: {exc.strerror or exc}") from None
        self._fd = fd
        self._end = len(self._header)
        """Where the next line goes (the text ends there, with a NUL)."""
        self.others = HostJournals(directory, self.path, lease)
        """The journals of this host's other listeners of the prefix."""

    @classmethod
    def for_listener(cls, identity: str, owner: str, lease: float) -> Journal | None:
        """The journal of listener ``owner`` among those of ``identity``
        (:func:`server_identity`), or None (logged) when none can be kept."""
        try:
            return cls(journal_directory(identity), owner, lease)
        except JournalUnavailable as exc:
            log.warning("no endings journal (%s): a run that ended in a process that dies "
                        "before its ending is written to Redis runs again", exc)
            return None

    # -- writing (any thread) ---------------------------------------------------------

    def note(self, lane: int, run: Run) -> tuple[str, bytes] | None:
        """The line a thread appends when ``run``'s function returned (:meth:`append`);
        None for an id the line cannot hold as it is (its ending is journaled as it is
        queued)."""
        line = completed_line(lane, run.token, run.escaped_id, run.due_ms)
        return None if line is None else (run.token, line)

    def aside(self, lane: int, run: Run) -> tuple[str, bytes] | None:
        """Where a quarantine child running ``run`` notes that its task returned, and the
        line (:func:`note_aside`, in the child); the file goes once the ending is journaled
        here (:meth:`ending`). None without a journal, or for an id a line cannot hold."""
        line = completed_line(lane, run.token, run.escaped_id, run.due_ms)
        if line is None or self._map is None:
            return None
        self._aside.add(run.token)
        return str(self.path.with_name(self.path.name + ASIDE + run.token)), line

    def append(self, token: str, line: bytes) -> None:
        """Append ``token``'s ending line (from any thread)."""
        with self._lock:
            mapped = self._map
            if mapped is None:
                return
            self._pending[token] = line
            end = self._end
            new = end + len(line)
            if new >= len(mapped):  # full: a file with what is pending, larger if need be
                self._replace(len(line))
                return
            mapped[end:new] = line
            mapped[new] = 0
            self._end = new

    def ending(self, lane: int, ending: Ending) -> None:
        """Journal an ending as it is queued, unless its thread journaled it already; then
        the line its quarantine child noted aside, if any, goes."""
        token = ending.token
        if not token:
            return  # a rejected event key: no run to end
        self._journal_ending(lane, token, ending)
        if token in self._aside:
            self._aside.discard(token)
            with contextlib.suppress(OSError):
                os.unlink(self.path.with_name(self.path.name + ASIDE + token))

    def _journal_ending(self, lane: int, token: str, ending: Ending) -> None:
        if ending.kind is _OK:
            line = self._pending.get(token)
            if line is not None and line[:1] == b"O":
                return
            if ending.run_of is not None and (line := completed_line(
                    lane, token, *ending.run_of)) is not None:
                self.append(token, line)
                return
        self.append(token, ending_line(lane, ending))

    def written(self, tokens: Iterable[str]) -> None:
        """Redis has these endings: drop them; the text is emptied when nothing is left
        (the usual case, once per batch: no system call), and the file replaced by one
        with what is left once it holds more than :data:`ROTATE_BYTES`."""
        with self._lock:
            pending = self._pending
            for token in tokens:
                pending.pop(token, None)
            mapped = self._map
            if mapped is None:
                return
            if not pending:
                self._end = len(self._header)
                mapped[self._end] = 0
            elif self._end > ROTATE_BYTES:
                self._replace(0)

    def _replace(self, more: int) -> None:
        """(Under the lock.) Replace the file by one with only the pending lines (and
        room for ``more`` bytes): made and locked aside, then renamed over the old one (an
        adopter checks that the file it locked is the one the path names)."""
        assert self._map is not None
        aside = self.path.with_name(self.path.name + ROTATING)
        text = self._header + b"".join(self._pending.values())
        size = max(MAP_BYTES, 2 * (len(text) + more))
        try:
            fd = open_locked(aside, os.O_CREAT | os.O_TRUNC)
            try:
                mapped = _mapped(fd, text, size)
                os.rename(aside, self.path)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            self._broken(exc)
            return
        self._map.close()
        os.close(self._fd)
        self._map, self._fd, self._end = mapped, fd, len(text)

    def _broken(self, exc: OSError) -> None:
        """(Under the lock.) Stop journaling: a file that cannot be written is no help."""
        log.error("endings journal %s failed (%s): no longer kept; a run that ends in this "
                  "process runs again if it dies before its ending is written to Redis",
                  self.path, exc)
        if self._map is not None:
            self._map.close()
        self._map = None
        self._pending.clear()

    def completed(self, token: str) -> bool:
        """Whether run ``token``'s function returned (its thread journaled it) and Redis
        does not have its ending yet."""
        line = self._pending.get(token)
        return line is not None and line[:1] == b"O"

    @property
    def unwritten(self) -> int:
        """Endings journaled that Redis does not have yet."""
        return len(self._pending)

    def close(self) -> None:
        """At exit: the file is deleted when Redis has every ending, else left, unlocked,
        for another listener to adopt."""
        with self._lock:
            mapped, self._map = self._map, None
            if mapped is None:
                return
            mapped.close()
            if self._pending:
                log.warning("%d run ending(s) not written to Redis are left in %s: a "
                            "listener of this prefix on this host writes them",
                            len(self._pending), self.path)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(self._fd)


def note_aside(path: str, line: bytes) -> None:
    """In a quarantine child whose task returned: write ``line`` (from
    :meth:`Journal.aside`) to ``path``, a new private file, before the child tells its
    listener; nothing if it cannot (the listener journals the ending as it reads it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return
    try:
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


def _mapped(fd: int, text: bytes, size: int) -> mmap.mmap:
    """``fd``'s file made ``size`` bytes long, ``text`` written at its start, mapped."""
    os.ftruncate(fd, size)
    mapped = mmap.mmap(fd, size)
    mapped[:len(text)] = text
    return mapped
