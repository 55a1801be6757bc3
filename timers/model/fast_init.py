"""A faster ``__init__`` for the frozen dataclasses made once or more per run (the
listener's) or per schedule (the producer's ``TimerSpec``, ``Invocation`` and ``Call``).

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__`` (a call per field, to get past the frozen ``__setattr__``); the one
made here writes the fields into the instance's ``__dict__`` directly. Same signature,
same defaults; equality, hashing, ``repr``, ``replace`` and pickling stay the
dataclass's. Without a call per field an instance is made much faster, on every run
and every schedule (figures: bench/FINDINGS.md, "A run's Python in the listener" and
"A schedule's client CPU per timer").
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from timers import speed

T = TypeVar("T")

_MISSING = object()


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen dataclass ``cls`` an ``__init__`` that fills ``__dict__`` directly.
    Refuses (TypeError) what it does not reproduce: slots, ``__post_init__``, keyword-only
    or non-init fields, ``InitVar`` and ``ClassVar``. With the speed trick ``init`` off
    (:mod:`timers.speed`) ``cls`` keeps the dataclass's own, once checked."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    if hasattr(cls, "__slots__") or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: slots or __post_init__ are not supported")
    if len(cls.__dataclass_fields__) != len(dataclasses.fields(cls)):  # type: ignore[attr-defined, arg-type]
        raise TypeError(f"{cls.__name__}: InitVar and ClassVar are not supported")
    namespace: dict[str, Any] = {"_MISSING": _MISSING}
    args, body = [], []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.kw_only or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: keyword-only or non-init field")
        name = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_d_{name}"] = f.default
            args.append(f"{name}=_d_{name}")
            body.append(f"    d[{name!r}] = {name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_f_{name}"] = f.default_factory
            args.append(f"{name}=_MISSING")
            body.append(f"    d[{name!r}] = _f_{name}() if {name} is _MISSING else {name}")
        else:
            args.append(name)
            body.append(f"    d[{name!r}] = {name}")
    if not speed.on("init"):
        return cls
    source = "\n".join([f"def __init__(self, {', '.join(args)}):", "    d = self.__dict__",
                        *body])
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    setattr(cls, "__init__", init)  # noqa: B010 (mypy refuses assigning a method)
    return cls
