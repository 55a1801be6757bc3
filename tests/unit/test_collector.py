"""A listener process's garbage collector (:mod:`timers.listener.tuning.collector`)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from timers import speed
from timers.listener.tuning import collector


@pytest.fixture
def restored_collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(speed.ENV, raising=False)  # the trick on, in CI's run with it off
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Cycle:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_tune_frees_garbage_first_freezes_the_rest_and_raises_the_young_threshold(
        restored_collector: None) -> None:
    gc.collect()
    frozen_before = gc.get_freeze_count()
    kept = [Cycle() for _ in range(100)]
    garbage = weakref.ref(Cycle())  # in a cycle, unreachable: only the collector frees it
    assert garbage() is not None
    collector.tune()
    assert garbage() is None, "garbage was frozen: it would never be freed"
    assert gc.get_freeze_count() - frozen_before >= len(kept)
    assert not any(type(obj) is Cycle for obj in gc.get_objects()), "frozen: out of reach"
    assert gc.get_threshold()[0] == collector.YOUNG_THRESHOLD
