"""A forked child does not repeat its parent's timer ids: a real ``os.fork`` (the same
without a process: ``tests/unit/test_producer.py``). No Redis involved: one server only."""

from __future__ import annotations

import os

import pytest

from timers.model.timer_ids import new_timer_id

pytestmark = [pytest.mark.integration, pytest.mark.one_server]


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, ",".join(new_timer_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    parents = {new_timer_id() for _ in range(50)}
    os.waitpid(pid, 0)
    childs = set(os.read(read, 10_000).decode().split(","))
    os.close(read)
    assert len(childs) == 50 and not parents & childs
