"""What every ``timers`` command shares: common options and one-line user errors."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import redis
import typer
from typer import core as typer_core

from timers.exceptions import TimersError, UserError
from timers.model.keys import DEFAULT_PREFIX, PREFIX_ENV, configured_prefix
from timers.model.redact import mask_secrets, safe_url
from timers.store.connect import URL_ENV, configured_url
from timers.store.server_errors import cannot_connect, url_address

if TYPE_CHECKING:
    from timers.producer.client import Timers

F = TypeVar("F", bound=Callable[..., Any])


def _plain_usage_name(self: Any) -> str:
    """``TASK`` for a required argument, ``[ARGS_JSON]`` for an optional one (Typer would
    print ``{task}`` and ``[[ARGS_JSON]]``)."""
    name = str(self.display_name_raw).strip("[]{}").upper()
    return name if self.required else f"[{name}]"


def _no_type_label(self: Any, ctx: Any) -> None:
    """No ``<str>`` after an argument's name in ``--help``."""
    return None


_option_type = typer_core.TyperOption.display_type_rich


def _option_type_label(self: Any, ctx: Any) -> str | None:
    """``--cron TEXT`` rather than ``--cron <str>``; choices stay ``<a|b>``."""
    label = _option_type(self, ctx)
    return {"<str>": "TEXT", "<int>": "N", "<float>": "SECONDS"}.get(str(label), label)


typer_core.TyperOption.display_type_rich = _option_type_label  # type: ignore[method-assign]
typer_core.TyperArgument._usage_display_name = _plain_usage_name  # type: ignore[method-assign]
typer_core.TyperArgument.display_type_rich = _no_type_label  # type: ignore[method-assign]

UrlOption = Annotated[
    str | None,
    typer.Option("--url", metavar="URL", show_default=False,
                 help=f"Redis URL [default: ${URL_ENV} or redis://localhost:6379/0]"),
]


def prefix_callback(ctx: typer.Context, param: typer.CallbackParam, value: str) -> str:
    """The prefix given, else ``$TIMERS_PREFIX``, else ``timers``; one line if bad. (A
    command with a default of its own, ``demo``, keeps it.)"""
    source = ctx.get_parameter_source(param.name or "prefix")
    given = source is not None and source.name != "DEFAULT"
    try:
        return configured_prefix(value if given or value != DEFAULT_PREFIX else None)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


PrefixOption = Annotated[str, typer.Option(
    "--prefix", metavar="PREFIX", callback=prefix_callback, show_default=False,
    help=f"Key prefix of the timers: apps sharing one Redis use distinct prefixes "
         f"[default: ${PREFIX_ENV} or timers]")]


@dataclass
class ErrorOutput:
    """How this process writes its one error line: ``error: …`` as text, or, once
    ``timers listen`` is asked for ``--log-format json``, one JSON object like its log
    lines (level ERROR, logger ``timers.cli``), so every line it writes is JSON."""

    as_json: bool = False

    def line(self, message: str) -> str:
        text = one_line(mask_secrets(message))
        if not self.as_json:
            return f"error: {text}"
        from timers.logs import IDENTITY, JsonFormatter  # (only `timers listen` asks for it)

        record = logging.LogRecord("timers.cli", logging.ERROR, __file__, 0, text, None, None)
        IDENTITY.filter(record)
        return JsonFormatter().format(record)

    def write(self, message: str) -> None:
        typer.echo(self.line(message), err=True)


ERRORS = ErrorOutput()
"""This process's error output (one command per process)."""


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` (credentials masked, one line; JSON under ``timers listen
    --log-format json``) and return an exit 1."""
    ERRORS.write(message)
    return typer.Exit(1)


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable(value: object) -> str:
    """``value`` as text with control characters escaped (a newline shows as ``\\n``), so
    one item stays on one line of a table."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))


def when(dt: datetime) -> str:
    """``dt`` in UTC to the millisecond, as the commands print a time: ``2026-01-02
    03:04:05.678Z``."""
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with ``…``."""
    return text if len(text) <= width else text[: width - 1] + "…"


@contextlib.contextmanager
def user_errors(url: str | None = None) -> Iterator[None]:
    """Turn the errors a user can cause into one line on stderr and exit code 1."""
    try:
        yield
    except (TimersError, UserError) as exc:
        raise fail(str(exc)) from None
    except redis.exceptions.ConnectionError as exc:
        raise fail(cannot_connect(url_address(configured_url(url)), exc)) from None
    except redis.exceptions.AuthenticationError as exc:
        raise fail(f"Redis refused the credentials: {exc}") from None
    except redis.exceptions.RedisError as exc:
        raise fail(f"Redis answered with an error: {exc}") from None
    except ValueError as exc:
        if "Redis URL" in str(exc) or "redis://" in str(exc):
            raise fail(f"bad Redis URL: {exc}") from None
        raise


def parse_args_json(text: str | None) -> Any:
    """``ARGS_JSON`` as the library takes it (None if not given); a usage error (exit 2,
    one line) if it is not JSON or is nested too deeply to read."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise typer.BadParameter(f"nested too deeply to read ({len(text)} characters)",
                                 param_hint="'ARGS_JSON'") from None
    except ValueError as exc:
        raise typer.BadParameter(f"not valid JSON ({exc}): {text[:80]!r}",
                                 param_hint="'ARGS_JSON'") from None


def friendly(fn: F) -> F:
    """Run a command under :func:`user_errors`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_errors(kwargs.get("url")):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def open_timers(url: str | None, prefix: str) -> Timers:
    """A client for a command; a bad URL is a one-line error. (The client is imported
    here, when a command runs, so that the command line starts fast.)"""
    from timers.producer.client import Timers

    try:
        return Timers(url, prefix=prefix)
    except TimersError:
        raise  # (a bad $TIMERS_SHARDS, say: not the URL's fault)
    except ValueError as exc:
        raise UserError(f"bad Redis URL {safe_url(configured_url(url))!r}: {exc}") from None
