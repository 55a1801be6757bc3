"""The endings journal (:mod:`timers.listener.endings.journal`): what it keeps, what it drops, what
another listener may adopt of it, and what it refuses to read. Files only: a "dead"
listener's journal is one whose lock nobody holds (the kernel drops a dead process's)."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import time
from pathlib import Path

import pytest

from timers.listener.endings import journal as journal_module
from timers.listener.endings.adoption import KEEP_ADOPTED, KEEP_ASIDE, DeadJournal
from timers.listener.endings.ending import Ending
from timers.listener.endings.journal import (
    DIR_ENV,
    Journal,
    JournalUnavailable,
    journal_directory,
    note_aside,
)
from timers.listener.endings.journal_format import (
    SUFFIX,
    ending_line,
    file_name,
    parse,
    read_text,
)
from timers.model.runs import Run
from timers.model.wire import EndingKind, FailureRecord

OWNER = "host-a:101:abc123"
OTHER = "host-a:102:def456"


def run(token: str, escaped_id: str = "t1", due_ms: int = 1000) -> Run:
    return Run(token, escaped_id, "tasks.x:[]", due_ms, 0, "sweep")


def failed(token: str) -> Ending:
    record = FailureRecord("dead", "ValueError", "boom", 5, id="t2", task="tasks.x")
    return Ending(token, EndingKind.FAIL, failure_id=f"t2:{token}", failure=record,
                  run_of=("t2", 2000))


def retried(token: str) -> Ending:
    return Ending(token, EndingKind.RETRY, retry_entry="t3:tasks.x;a=1:[]",
                  retry_delay_ms=1500, run_of=("t3", 3000))


def text(path: Path) -> bytes:
    """A journal's text: up to its first NUL."""
    return path.read_bytes().split(b"\0", 1)[0]


def lines(path: Path) -> list[str]:
    return text(path).decode().splitlines()


def endings_in(path: Path, lane: int = 0) -> dict[str, Ending]:
    return parse(text(path)).endings.get(lane, {})


def test_an_ending_is_on_disk_from_the_end_of_its_run_until_redis_has_it(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path, OWNER)
    journal.append(*journal.note(0, run("7", "t1", 1000)))  # as the thread does
    journal.ending(1, failed("8"))  # as the event loop queues it
    journal.ending(0, retried("9"))
    kept = parse(text(journal.path))
    assert kept.owner == OWNER and kept.skipped == 0
    assert kept.endings[0]["7"] == Ending("7", EndingKind.OK, run_of=("t1", 1000))
    assert kept.endings[1]["8"].wire() == failed("8").wire()
    assert kept.endings[0]["9"] == retried("9")
    journal.written(["7", "8"])
    assert journal.unwritten == 1 and "9" in endings_in(journal.path)
    journal.written(["9"])
    assert lines(journal.path) == [f"H {json.dumps(OWNER)}"], "emptied: Redis has them all"
    journal.close()
    assert not journal.path.exists(), "a clean exit leaves nothing behind"


def test_a_journal_emptied_and_written_again_holds_only_its_new_endings(
        tmp_path: Path) -> None:
    """Emptied, the journal's text is written again from its start, over the old lines: an
    adopter (who reads up to the first NUL) must find the new ending only, never an old one
    Redis has already (a stale hand-back or failure written twice)."""
    journal = Journal(tmp_path, OWNER)
    journal.ending(0, failed("8"))
    journal.ending(0, retried("9"))
    journal.written(["8", "9"])
    journal.append(*journal.note(0, run("7", "t1", 1000)))  # shorter than either
    kept = parse(text(journal.path))
    assert list(kept.endings.get(0, {})) == ["7"] and kept.skipped == 0
    journal.close()


def test_a_run_journaled_by_its_thread_is_not_journaled_again_but_a_later_ending_is(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path, OWNER)
    journal.append(*journal.note(0, run("7")))
    size = len(text(journal.path))
    journal.ending(0, Ending.of(run("7"), EndingKind.OK))
    assert len(text(journal.path)) == size, "one line per completed run"
    journal.ending(0, Ending.release("7"))  # e.g. a step after the run failed: handed back
    assert endings_in(journal.path)["7"].kind is EndingKind.RELEASE, "the last one counts"
    journal.ending(0, Ending("", EndingKind.REJECT, failure_id="k", failure=failed("1").failure))
    assert "" not in endings_in(journal.path), "a rejected event key is no run"


def test_a_journal_never_emptied_is_rewritten_with_its_unwritten_endings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "ROTATE_BYTES", 2000)
    journal = Journal(tmp_path, OWNER)
    journal.append(*journal.note(0, run("1", "first")))
    for n in range(2, 200):  # a steady load: the first never written, the rest are
        journal.append(*journal.note(0, run(str(n), f"id{n}")))
        journal.written([str(n - 1)] if n > 2 else [])
    assert len(text(journal.path)) < 2000
    kept = endings_in(journal.path)
    assert "1" in kept and "199" in kept, "the unwritten ones"
    assert "2" not in kept and len(kept) < 150, "rewritten without those written before"
    assert DeadJournal.lock(journal.path) is None, "the new file is locked too"
    assert not list(tmp_path.glob("*.rotating"))


def test_a_journal_grows_with_its_unwritten_endings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "MAP_BYTES", 4096)
    journal = Journal(tmp_path, OWNER)
    for n in range(1, 1000):  # Redis away: nothing written
        journal.append(*journal.note(0, run(str(n), f"id{n}")))
    assert set(endings_in(journal.path)) == {str(n) for n in range(1, 1000)}
    assert journal.path.stat().st_size > 4096
    journal.written([str(n) for n in range(1, 1000)])
    assert lines(journal.path) == [f"H {json.dumps(OWNER)}"]


def test_a_live_journal_is_left_alone_and_a_dead_one_is_adopted_once(
        tmp_path: Path) -> None:
    live = Journal(tmp_path, OTHER)
    live.append(*live.note(0, run("5")))
    dead_path = tmp_path / file_name(OWNER)
    dead_path.write_text(f"H {json.dumps(OWNER)}\nO 0 7 1000 t1\n")  # nobody locks it
    me = Journal(tmp_path, "host-a:103:aaaaaa")
    found = me.others.dead()
    assert [d.path for d in found] == [dead_path], "the live one's lock is held"
    (dead,) = found
    assert dead.tokens(0) == ["7"]
    assert me.others.dead() == [], "locked by the adopter meanwhile"
    dead.adopted()
    assert me.others.dead() == [], "adopted: not written twice"
    adopted = dead_path.with_name(dead_path.name + ".adopted")
    assert adopted.exists(), "kept a while, for a run recovered meanwhile"
    old = time.time() - KEEP_ADOPTED * me.lease - 1
    os.utime(adopted, (old, old))
    assert me.others.dead() == []
    assert not adopted.exists(), "deleted once old"


def test_a_dead_journal_gives_only_the_endings_of_runs_still_leased(tmp_path: Path) -> None:
    path = tmp_path / file_name(OWNER)
    path.write_text(f"H {json.dumps(OWNER)}\n"
                    'O 0 7 1000 t1\n'  # still held by the owner: written
                    'O 0 8 1000 t8\n'  # ended already (or recovered): its record is gone
                    'O 0 9 1000 t9\n'  # adopted by a listener that died in turn
                    'O 0 10 1000 t10\n'  # token held, but for another due time
                    + ending_line(0, Ending.release("11")).decode()
                    + ending_line(0, Ending.release("12")).decode())
    dead = DeadJournal.lock(path)
    assert dead is not None
    records = [f"0@{OWNER}|1000|t1:tasks.x:[]".encode(), None,
               f"0@{OTHER}|1000|t9:tasks.x:[]", f"0@{OWNER}|2000|t10:tasks.x:[]",
               f"0@{OWNER}|1000|t11:tasks.x:[]",
               f"0@{OTHER}|1000|t12:tasks.x:[]"]  # a hand-back of a run it did not claim
    assert dead.tokens(0) == ["7", "8", "9", "10", "11", "12"]
    held = dead.held_by_owner(0, records)
    assert [e.token for e in held] == ["7", "9", "11"]
    dead.release()


def test_a_recovered_run_finds_how_the_dead_listener_ended_it(tmp_path: Path) -> None:
    dead = Journal(tmp_path, OWNER)
    dead.append(*dead.note(2, run("7", "t1", 1000)))
    dead.ending(2, failed("8"))
    me = Journal(tmp_path, OTHER)
    assert me.others.ending_of(OWNER, 2, run("40", "t1", 1000)) == Ending(
        "7", EndingKind.OK, run_of=("t1", 1000))
    assert me.others.ending_of(OWNER, 2, run("41", "t2", 2000)) == failed("8")
    assert me.others.ending_of(OWNER, 2, run("42", "t1", 1001)) is None, "another run of it"
    assert me.others.ending_of(OWNER, 1, run("43", "t1", 1000)) is None, "another shard"
    assert me.others.ending_of("host-b:1:x", 2, run("44", "t1", 1000)) is None, "no such file"
    dead.ending(2, retried("9"))
    assert me.others.ending_of(OWNER, 2, run("45", "t3", 3000)) == retried("9"), "read again"


def test_a_quarantine_childs_completion_noted_aside_ends_a_rerun_the_same_way(
        tmp_path: Path) -> None:
    """A quarantine child whose task returned notes it beside its listener's journal
    before it says so: a rerun elsewhere on the host finds it while that listener is
    paused (or dead) with the outcome unread; once the listener journals the ending
    itself, the note goes."""
    paused = Journal(tmp_path, OWNER)
    where = paused.aside(1, run("7", "t1", 1000))
    assert where is not None
    note_aside(*where)  # in the child, before it sends the outcome
    me = Journal(tmp_path, OTHER)
    assert me.others.ending_of(OWNER, 1, run("40", "t1", 1000)) == Ending(
        "7", EndingKind.OK, run_of=("t1", 1000))
    assert me.others.ending_of(None, 1, run("41", "t1", 1000)) is not None, "any listener's"
    assert me.others.ending_of(OWNER, 1, run("42", "t1", 1001)) is None, "another run of it"
    assert me.others.dead() == [] and Path(where[0]).exists(), "not a journal; not old"
    paused.ending(1, Ending("7", EndingKind.OK, run_of=("t1", 1000)))  # it read it
    assert not Path(where[0]).exists()
    assert me.others.ending_of(OWNER, 1, run("43", "t1", 1000)) is not None, "in its journal now"


def test_a_note_aside_nobody_took_up_is_deleted_once_old(tmp_path: Path) -> None:
    gone = Journal(tmp_path, OWNER)
    where = gone.aside(0, run("7"))
    assert where is not None
    note_aside(*where)
    me = Journal(tmp_path, OTHER)
    old = time.time() - KEEP_ASIDE * me.lease - 1
    os.utime(where[0], (old, old))
    assert gone.others.dead() == [] and Path(where[0]).exists(), "its own listener's: kept"
    me.others.dead()
    assert not Path(where[0]).exists()


def test_what_does_not_read_is_skipped_and_the_rest_kept() -> None:
    good = 'O 0 7 1000 t1'
    bad = [
        'O 0 x7 1000 t1',  # token not a number
        'O -1 7 1000 t1',  # lane
        'O 0 7 soon t1',  # due time
        'O 0 7 1000',  # no id
        'O 0 7 1000 a:b',  # an escaped id holds no ':'
        "E 0 {}",  # fields missing
        'E 0 {"t": "8", "k": "reject", "f": "", "r": null, "e": "", "d": 0, "o": null, '
        '"g": 0}',  # no run to end
        'E 0 {"t": "8", "k": "fail", "f": "", "r": null, "e": "", "d": 0, "o": null, '
        '"g": 0}',  # a failure without its record: finish.lua would refuse the batch
        'E 0 {"t": "8", "k": "retry", "f": "", "r": null, "e": "no-entry", "d": 5, '
        '"o": null, "g": 0}',
        'E 0 {"t": "8", "k": "release", "f": "", "r": null, "e": "", "d": 0, "o": null, '
        '"g": -5}',
        "Z whatever",
        "\xff\xfe",
        f"H {json.dumps(OWNER)}",  # a header not first
    ]
    data = "\n".join([f"H {json.dumps(OWNER)}", *bad, good, 'O 0 9 10']).encode()
    contents = parse(data)  # the last line torn: its process died mid-write
    assert contents.owner == OWNER
    assert contents.endings == {0: {"7": Ending("7", EndingKind.OK, run_of=("t1", 1000))}}
    assert contents.skipped == len(bad) + 1
    assert parse(b"").endings == {} and parse(b"\n\n").skipped == 2


def test_an_id_a_line_cannot_hold_is_journaled_whole(tmp_path: Path) -> None:
    journal = Journal(tmp_path, OWNER)
    odd = "a b\nO 0 99 5 forged\0x"  # a space, a line end, a NUL
    assert journal.note(0, run("7", odd)) is None, "not a line of its own"
    journal.ending(0, Ending.of(run("7", odd), EndingKind.OK))
    journal.append(*journal.note(0, run("8", "a b")))
    assert endings_in(journal.path) == {
        "7": Ending("7", EndingKind.OK, run_of=(odd, 1000)),
        "8": Ending("8", EndingKind.OK, run_of=("a b", 1000))}


def test_the_directory_is_private_to_its_user(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "journals"))
    directory = journal_directory("localhost:6379/0 timers")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert journal_directory("localhost:6379/0 timers") == directory
    assert journal_directory("localhost:6380/0 timers") != directory, "per server"
    assert journal_directory("localhost:6379/0 other") != directory, "per prefix"
    open_dir = journal_directory("open")
    open_dir.chmod(0o755)
    with pytest.raises(JournalUnavailable, match="open to other users"):
        journal_directory("open")
    linked = journal_directory("linked")
    linked.rmdir()
    linked.symlink_to(tmp_path)
    with pytest.raises(JournalUnavailable, match="not a directory"):
        journal_directory("linked")


@pytest.mark.parametrize("runtime", ["unset", "a file"])
def test_without_a_runtime_directory_the_journals_go_to_the_temporary_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str) -> None:
    """``$XDG_RUNTIME_DIR`` first, where it is a directory; unset, or naming something
    else, the journals live in the temporary directory, under the user's id."""
    monkeypatch.delenv(DIR_ENV, raising=False)
    if runtime == "unset":
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "file"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    directory = journal_directory("localhost:6379/0 timers")
    assert directory.parent == tmp_path / "tmp" / f"timers-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # a directory: used
    assert journal_directory("localhost:6379/0 timers").parent == tmp_path / "timers"


def test_a_listener_that_cannot_keep_a_journal_says_so_and_runs_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(DIR_ENV, str(blocked))
    assert Journal.for_listener("abc timers", OWNER, 15.0) is None
    assert "no endings journal" in caplog.text and str(blocked) in caplog.text


def test_a_journal_is_locked_while_its_listener_lives(tmp_path: Path) -> None:
    journal = Journal(tmp_path, OWNER)
    fd = os.open(journal.path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert journal.path.name.endswith(SUFFIX)
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    journal.append(*journal.note(0, run("7")))
    journal.close()
    assert journal.path.exists(), "left with an unwritten ending, for adoption"
    assert DeadJournal.lock(journal.path) is not None


@pytest.mark.parametrize("size", [0, 1 << 16])
def test_a_journals_text_ends_at_its_first_nul_also_at_a_reads_first_byte(
        tmp_path: Path, size: int) -> None:
    """A journal is a file made long, its text at its start and zeros after: the text is
    what precedes the first NUL, also when none comes before it (a new journal) or the
    text fills whole reads (64 KiB): nothing of the zeros is read as text."""
    path = tmp_path / "j"
    text = b"x" * (size - 1) + b"\n" if size else b""
    path.write_bytes(text + bytes(1 << 17))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_text(fd) == text
    finally:
        os.close(fd)
