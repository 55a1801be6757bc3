"""The faster ``__init__`` of frozen dataclasses made per run builds the same objects as
the dataclass's own: same signature and defaults, a fresh default per instance, still
frozen, equal, hashable, replaceable and picklable."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field

import pytest

from timers.listener.endings.ending import Ending
from timers.model.encoding import Record
from timers.model.fast_init import fast_init
from timers.model.runs import Fired, Run
from timers.model.wire import EndingKind
from timers.ops.base import Call
from timers.ops.operations import TimerSpec
from timers.store.script_calls import Invocation


@dataclass(frozen=True)
class Plain:
    a: str
    b: int = 2
    c: dict[str, str] = field(default_factory=dict)


@fast_init
@dataclass(frozen=True)
class Fast:
    a: str
    b: int = 2
    c: dict[str, str] = field(default_factory=dict)


def test_it_builds_what_the_dataclass_builds() -> None:
    for args, kwargs in [(("x",), {}), (("x", 3), {}), (("x",), {"c": {"k": "v"}}),
                         ((), {"a": "y", "b": 5})]:
        fast, plain = Fast(*args, **kwargs), Plain(*args, **kwargs)  # type: ignore[arg-type]
        assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
        assert repr(fast).removeprefix("Fast") == repr(plain).removeprefix("Plain")
    assert Fast("x").c is not Fast("x").c, "a fresh default per instance"
    with pytest.raises(TypeError):
        Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fast("x", 1, {}, 4)  # type: ignore[call-arg]


def test_it_stays_frozen_equal_hashable_replaceable_and_picklable() -> None:
    one = Fast("x", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = "y"  # type: ignore[misc]
    assert one == Fast("x", 3) and one != Fast("x", 4)
    assert dataclasses.replace(one, b=9) == Fast("x", 9)
    assert pickle.loads(pickle.dumps(one)) == one
    ending = Ending("t", EndingKind.OK, run_of=("id", 1))
    assert hash(ending) == hash(Ending("t", EndingKind.OK, run_of=("id", 1)))


@pytest.mark.parametrize("cls", [Run, Fired, Record, Ending, TimerSpec, Invocation, Call])
def test_the_classes_made_per_run_keep_their_fields_as_parameters(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default is f.default
        elif f.default_factory is dataclasses.MISSING:
            assert p.default is inspect.Parameter.empty


def test_what_it_cannot_reproduce_is_refused() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    for cls in (Mutable, Post, KeywordOnly):
        with pytest.raises(TypeError):
            fast_init(cls)
