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
renames the file ``….adopted``, deleted :data:`KEEP_ADOPTED` leases later. A run recovered
from a listener on this host whose journal (adopted or not) holds its ending is ended that
way, not run again (:meth:`Journal.ending_of`): that listener died, or stalled past its
lease after the run ended. A file is data: a line that does not read is skipped.

Text (up to the first NUL): ``H <owner id, JSON>`` (first), ``O <lane> <token> <due ms>
<escaped id>`` (a run that completed), ``E <lane> <ending, JSON>`` (any other).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timers.exceptions import JournalUnavailable
from timers.listener.endings.writer import Ending
from timers.model.encoding import as_text
from timers.model.run_record import decode
from timers.model.runs import Run
from timers.model.wire import EndingKind, FailureRecord

log = logging.getLogger("timers.listener")

DIR_ENV = "TIMERS_ENDINGS_DIR"
"""Where the journals go instead of ``$XDG_RUNTIME_DIR/timers`` or ``<tmp>/timers-<uid>``
(a directory per prefix and server is made in it)."""
SUFFIX = ".endings"
ROTATING = ".rotating"
ADOPTED = ".adopted"
ASIDE = ".q"
"""A quarantine child's line that its run completed, in a file of its own beside its
listener's journal (``<journal file>.q<token>``, :func:`note_aside`): the child writes it
before it tells its listener, so a rerun finds it while that listener is paused or after
it died, before the listener journaled the ending itself."""
MAP_BYTES = 1 << 20
"""The size a journal file is made with (sparse: only the pages written take room)."""
ROTATE_BYTES = MAP_BYTES // 2
"""A journal whose endings are never all written at once (a steady load) is replaced by
one with only the unwritten ones when its text grows past this."""
MAX_READ = 64 << 20
"""Bytes read of a journal at most (a live one stays near :data:`ROTATE_BYTES`)."""
KEEP_ASIDE = 30
"""Leases a line a quarantine child noted aside is kept when its listener did not take it
up (it died first): a rerun of the run, on this host, ends the same way meanwhile."""
KEEP_ADOPTED = 2
"""Leases an adopted journal is kept, for a run of it recovered meanwhile elsewhere on
this host (:meth:`Journal.ending_of`)."""

_OK = EndingKind.OK
_KINDS = {kind.value: kind for kind in EndingKind if kind is not EndingKind.REJECT}
_REQUEUED = {EndingKind.RETRY, EndingKind.MOVE, EndingKind.WAIT}
_ENTRY = re.compile(r"[^:]+:[^:]+:")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_name(owner: str) -> str:
    """The journal file of listener ``owner`` (its id, ``host:pid:random``)."""
    return _UNSAFE.sub("_", owner)[:200] + SUFFIX


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


def _open_locked(path: Path, flags: int) -> int:
    """A descriptor of ``path`` under this process's exclusive lock (an error if another
    process holds it)."""
    fd = os.open(path, flags | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
            fd = _open_locked(self.path, os.O_CREAT | os.O_EXCL)
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
        line = _completed(lane, run.token, run.escaped_id, run.due_ms)
        return None if line is None else (run.token, line)

    def aside(self, lane: int, run: Run) -> tuple[str, bytes] | None:
        """Where a quarantine child running ``run`` notes that its task returned, and the
        line (:func:`note_aside`, in the child); the file goes once the ending is journaled
        here (:meth:`ending`). None without a journal, or for an id a line cannot hold."""
        line = _completed(lane, run.token, run.escaped_id, run.due_ms)
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
            if ending.run_of is not None and (line := _completed(
                    lane, token, *ending.run_of)) is not None:
                self.append(token, line)
                return
        self.append(token, b"E %d %s\n" % (lane, _encode(ending).encode()))

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
            fd = _open_locked(aside, os.O_CREAT | os.O_TRUNC)
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

    # -- reading others' journals (the event loop) --------------------------------------

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
                            and not _own_aside(path, self.path):
                        os.unlink(path)
            elif name.endswith(SUFFIX) and path != self.path:
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
                text = _text(fd)
            except OSError:
                continue
            finally:
                os.close(fd)
            wanted = (run.escaped_id, run.due_ms)
            for ending in reversed(list(parse(text).endings.get(lane, {}).values())):
                if ending.run_of == wanted:
                    return ending
        return None


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


def _own_aside(path: Path, journal: Path) -> bool:
    """Whether ``path`` is a line noted aside for this listener's own journal ``journal``
    (it goes when the ending is journaled: :meth:`Journal.ending`)."""
    return path.name.startswith(journal.name + ASIDE)


def _completed(lane: int, token: str, escaped_id: str, due_ms: int) -> bytes | None:
    """The line of a run that completed; None when its id holds a line end or a NUL."""
    if "\n" in escaped_id or "\0" in escaped_id:
        return None
    try:
        return f"O {lane} {token} {due_ms} {escaped_id}\n".encode()
    except UnicodeEncodeError:
        return None


def _mapped(fd: int, text: bytes, size: int) -> mmap.mmap:
    """``fd``'s file made ``size`` bytes long, ``text`` written at its start, mapped."""
    os.ftruncate(fd, size)
    mapped = mmap.mmap(fd, size)
    mapped[:len(text)] = text
    return mapped


def _text(fd: int) -> bytes:
    """A journal's text: up to its first NUL (:data:`MAX_READ` bytes at most)."""
    chunks = []
    at = 0
    while at < MAX_READ:
        chunk = os.pread(fd, 1 << 16, at)
        end = chunk.find(b"\0")
        if end >= 0 or not chunk:
            chunks.append(chunk if end < 0 else chunk[:end])
            break
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def _delete_if_unlocked(path: Path) -> None:
    """A rotation cut short by its process's death: its content is still in the journal."""
    try:
        fd = _open_locked(path, 0)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


@dataclass
class Contents:
    """What a journal file holds."""

    owner: str | None = None
    endings: dict[int, dict[str, Ending]] = field(default_factory=dict)
    """Lane -> run token -> its last ending, in the order first written."""
    skipped: int = 0
    """Lines that did not read (a torn last line, or damage)."""


def parse(data: bytes) -> Contents:
    """Read a journal's text; what does not read is skipped and counted."""
    contents = Contents()
    lines = data.split(b"\n")
    if lines[-1]:
        contents.skipped += 1  # torn: its process died in the middle of the write
    for number, line in enumerate(lines[:-1]):
        try:
            kind, _, rest = line.decode().partition(" ")
            if kind == "H" and number == 0:
                owner = json.loads(rest)
                if not isinstance(owner, str):
                    raise ValueError(owner)
                contents.owner = owner
            elif kind == "O":
                lane_text, token, due, escaped_id = rest.split(" ", 3)
                ending = _checked(Ending(token, _OK, run_of=(escaped_id, _count(due))))
                contents.endings.setdefault(_count(lane_text), {})[token] = ending
            elif kind == "E":
                lane_text, text = rest.split(" ", 1)
                ending = _checked(_decode(json.loads(text)))
                contents.endings.setdefault(_count(lane_text), {})[ending.token] = ending
            else:
                raise ValueError(kind)
        except (ValueError, TypeError, KeyError, AttributeError):
            contents.skipped += 1
    return contents


def _count(text: object) -> int:
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    if isinstance(text, str) and text.isascii() and text.isdigit():
        return int(text)
    raise ValueError(text)


def _encode(ending: Ending) -> str:
    return json.dumps({"t": ending.token, "k": ending.kind.value, "f": ending.failure_id,
                       "r": ending.failure.to_json() if ending.failure else None,
                       "e": ending.retry_entry, "d": ending.retry_delay_ms,
                       "o": list(ending.run_of) if ending.run_of else None,
                       "g": ending.grace_ms})


def _decode(data: dict[str, Any]) -> Ending:
    failure = data["r"]
    run_of = data["o"]
    if run_of is not None:
        escaped, due = run_of
        if not isinstance(escaped, str):
            raise ValueError(escaped)
        run_of = (escaped, _count(due))
    for name in ("t", "f", "e"):
        if not isinstance(data[name], str):
            raise ValueError(name)
    return Ending(data["t"], _KINDS[data["k"]], failure_id=data["f"],
                  failure=None if failure is None else FailureRecord.from_dict(
                      json.loads(failure)),
                  retry_entry=data["e"], retry_delay_ms=_count(data["d"]), run_of=run_of,
                  grace_ms=_count(data["g"]))


def _checked(ending: Ending) -> Ending:
    """``ending`` if ``finish.lua`` takes it (a bad one would fail the batch it is in)."""
    if not (ending.token.isascii() and ending.token.isdigit()):
        raise ValueError(ending.token)
    if ending.run_of is not None and (not ending.run_of[0] or ":" in ending.run_of[0]):
        raise ValueError(ending.run_of)
    kind = ending.kind
    if kind is EndingKind.FAIL and (not ending.failure_id or ending.failure is None):
        raise ValueError(kind)
    if kind in _REQUEUED and not _ENTRY.match(ending.retry_entry):
        raise ValueError(kind)
    return ending


class DeadJournal:
    """The journal of a process that is gone, locked by this one."""

    def __init__(self, path: Path, fd: int, contents: Contents) -> None:
        self.path, self.fd, self.contents = path, fd, contents

    @classmethod
    def lock(cls, path: Path) -> DeadJournal | None:
        """``path``'s journal when its process is gone (its lock can be taken and the path
        still names the file locked), else None."""
        try:
            fd = _open_locked(path, 0)
        except OSError:
            return None  # its process lives (or it is gone already)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or os.stat(path).st_ino != info.st_ino:
                raise OSError("replaced")
            text = _text(fd)
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
