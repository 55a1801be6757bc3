"""Option and argument values converted without Pydantic.

Typer converts every value through a Pydantic ``TypeAdapter``, which costs a command CPU
at start (importing Pydantic and building the adapters), more than the rest of ``timers
schedule`` (figures: bench/FINDINGS.md, "Start-up CPU"). The command line's values are
all plain (text, whole numbers, numbers with bounds, lists of text, a few fixed choices),
so :func:`plain_values` gives each such parameter a conversion of its own, with a
one-line message naming what the value must be; any other kind keeps Typer's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from typer._click.exceptions import BadParameter
from typer._coercion import RuntimeParam


@dataclass(frozen=True)
class PlainValue(RuntimeParam):
    """A text, whole number, number (with its ``min``/``max``), fixed choice, or a list of
    texts, converted by hand."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        annotation: Any = self.annotation
        if get_origin(annotation) is list:
            items = value if isinstance(value, list | tuple) else [value]
            return [self._one(get_args(annotation)[0], item, param, ctx) for item in items]
        return self._one(annotation, value, param, ctx)

    def _one(self, kind: Any, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if kind is str:
            return str(value)
        if get_origin(kind) is Literal:
            choices = get_args(kind)
            if value in choices:
                return value
            raise BadParameter(f"{value!r} is not one of {', '.join(map(repr, choices))}",
                               ctx=ctx, param=param)
        try:
            number = kind(value) if not isinstance(value, kind) else value
        except (TypeError, ValueError):
            what = "a whole number" if kind is int else "a number"
            raise BadParameter(f"{value!r} is not {what}", ctx=ctx, param=param) from None
        low, high = self.parameter_info.min, self.parameter_info.max
        if (low is not None or high is not None) and math.isnan(number):
            raise BadParameter(f"{value!r} is not a number", ctx=ctx, param=param)
        if low is not None and number < low:
            raise BadParameter(f"must be at least {low}, got {value}", ctx=ctx, param=param)
        if high is not None and number > high:
            raise BadParameter(f"must be at most {high}, got {value}", ctx=ctx, param=param)
        return number


def _plain(annotation: Any) -> bool:
    if get_origin(annotation) is list:
        return _plain(get_args(annotation)[0])
    if get_origin(annotation) is Literal:
        return all(isinstance(c, str) for c in get_args(annotation))
    return annotation in (str, int, float)


def plain_values(params: Iterable[Any]) -> None:
    """Give each plain parameter of ``params`` (Typer's) the conversion of
    :class:`PlainValue` (a parameter with a ``parser``, clamped bounds, or a type of
    another kind keeps Typer's)."""
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            continue
        info = descriptor.parameter_info
        if (info.parser is None and not info.clamp and descriptor.file_annotation is None
                and not getattr(descriptor, "is_path", False) and _plain(descriptor.annotation)):
            param._runtime_param = PlainValue(parameter_info=info,
                                              annotation=descriptor.annotation)
