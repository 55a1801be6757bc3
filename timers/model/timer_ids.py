"""Generated timer ids: unique, URL-safe, and sorted in the order they were made.

Timers due at the same millisecond sit in the due index under one score, where Redis
orders them by id; so do timers waiting in one flow queue at the same priority and due
time. Ids that sort in the order they were made therefore run such timers in the order
they were scheduled (FIFO), where random ids ran them in a random order: 1,000 commands
for 50 devices scheduled in one call start with each device's first, not with whichever
ids happened to sort first.

An id is 14 characters from an alphabet in ASCII order: 7 for the wall clock in ms, then
7 (42 bits) for a counter that starts at a random value each millisecond and counts up
within it. Two producers meet only if they make ids in the same millisecond from counter
starts less than their number of ids apart: about 5 in 10^12 for two producers making ten
ids each in one millisecond. (With 5 counter characters it was 4 in 10^8, enough for a
busy fleet to reuse an id every few minutes; 14 characters cost no more Redis memory per
timer than 12, measured.) A generated id that does meet a pending one is replaced by a
fresh one (:meth:`timers.ops.operations.Operations.schedule_many`). The clock never steps
back within a process, and a forked child starts its own sequence.
"""

from __future__ import annotations

import os
import threading
import time
from binascii import b2a_base64
from collections.abc import Callable

ALPHABET = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
"""64 URL-safe characters in ASCII order, so ids compare as their numbers do."""
TIME_CHARS = 7
"""42 bits of milliseconds: until the year 2109."""
COUNTER_CHARS = 7
_COUNTER_START = 1 << (6 * COUNTER_CHARS - 1)
"""A millisecond's counter starts below this, leaving as many ids again within it."""
_COUNTER_LAST = 2 * _COUNTER_START - 1


_FROM_BASE64 = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", ALPHABET.encode())


def id_text(ms: int, counter: int) -> str:
    """The id of ``counter`` in millisecond ``ms``: 7 digits of each in :data:`ALPHABET`.
    One base64 pass of the 84-bit number (12 bytes, whose first 2 digits are its leading
    zeros), mapped onto the ordered alphabet: far cheaper than a digit-by-digit loop, on
    every schedule (figures: bench/FINDINGS.md, "A schedule's client CPU per timer")."""
    number = (ms << (6 * COUNTER_CHARS)) | counter
    return b2a_base64(number.to_bytes(12, "big"), newline=False)[2:].translate(
        _FROM_BASE64).decode()


class IdSequence:
    """Makes ids in order; ``wall_ms`` is the clock (injectable for tests)."""

    def __init__(self, wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000
                 ) -> None:
        self.wall_ms = wall_ms
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0
        self._random = b""
        """Random bytes not used yet: counter starts are drawn from them."""

    def _start(self) -> int:
        """A random counter start below :data:`_COUNTER_START`: 41 bits from
        ``os.urandom``, read for 64 starts at a time: a system call for each start showed
        in every schedule's CPU
        (figures: bench/FINDINGS.md, "A schedule's client CPU per timer")."""
        if not self._random:
            self._random = os.urandom(6 * 64)
        chunk, self._random = self._random[:6], self._random[6:]
        return int.from_bytes(chunk, "big") >> (48 - _COUNTER_START.bit_length() + 1)

    def next(self) -> str:
        with self._lock:
            now = max(self.wall_ms(), self._last_ms)
            if now != self._last_ms or self._counter >= _COUNTER_LAST:
                if now == self._last_ms:  # 2^29 ids in one ms: borrow the next ms
                    now += 1
                self._last_ms, self._counter = now, self._start()
            else:
                self._counter += 1
            return id_text(now, self._counter)

    def reset(self) -> None:
        """Start afresh (a forked child must not repeat its parent's sequence, nor use
        its random bytes)."""
        self._last_ms = self._counter = 0
        self._random = b""


_SEQUENCE = IdSequence()
os.register_at_fork(after_in_child=_SEQUENCE.reset)


def new_timer_id() -> str:
    """A fresh id: 14 URL-safe characters, later than every id made before it in this
    process, never starting with ``-`` (the command line would read ``timers get -x…``
    as an option: the first character is the top of the time, ``-`` only before 1972)."""
    return _SEQUENCE.next()
