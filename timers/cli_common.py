"""What every ``timers`` command shares: common options and one-line user errors."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import redis
import typer

from timers.client import URL_ENV, Timers, configured_url
from timers.exceptions import TimersError

F = TypeVar("F", bound=Callable[..., Any])

UrlOption = Annotated[
    str | None,
    typer.Option("--url", help=f"Redis URL [default: ${URL_ENV} or redis://localhost:6379/0]"),
]
PrefixOption = Annotated[str, typer.Option("--prefix", help="Key prefix of the timers.")]


class UserError(Exception):
    """A problem to report in one line."""


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


@contextlib.contextmanager
def user_errors(url: str | None = None) -> Iterator[None]:
    """Turn the errors a user can cause into one line on stderr and exit code 1."""
    try:
        yield
    except (TimersError, UserError) as exc:
        raise fail(str(exc)) from None
    except redis.exceptions.ConnectionError as exc:
        raise fail(f"cannot connect to Redis at {configured_url(url)}: {exc}") from None
    except redis.exceptions.AuthenticationError as exc:
        raise fail(f"Redis refused the credentials: {exc}") from None
    except redis.exceptions.RedisError as exc:
        raise fail(f"Redis answered with an error: {exc}") from None
    except ValueError as exc:
        if "Redis URL" in str(exc) or "redis://" in str(exc):
            raise fail(f"bad Redis URL: {exc}") from None
        raise


def friendly(fn: F) -> F:
    """Run a command under :func:`user_errors`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_errors(kwargs.get("url")):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def open_timers(url: str | None, prefix: str) -> Timers:
    try:
        return Timers(url, prefix=prefix)
    except ValueError as exc:
        raise UserError(f"bad Redis URL {configured_url(url)!r}: {exc}") from None
