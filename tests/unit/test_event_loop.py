"""The listener's event loop: uvloop when installed (``--loop auto``, the default),
asyncio's on request, a loop that cannot be had refused before the listener starts."""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util

import pytest

from timers.cli import app
from timers.cli.errors import run_app
from timers.listener.tuning import event_loop
from timers.listener.tuning.event_loop import LOOP_ENV, chosen_loop

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None
needs_uvloop = pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an install without the fast extra."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvloop" else real(name, *a))


def test_auto_is_uvloop_when_installed_and_asyncio_otherwise(
        monkeypatch: pytest.MonkeyPatch, no_uvloop: None) -> None:
    monkeypatch.delenv(LOOP_ENV, raising=False)
    assert chosen_loop() == chosen_loop("auto") == "asyncio"
    assert chosen_loop("asyncio") == "asyncio"


@needs_uvloop
def test_auto_picks_an_installed_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOOP_ENV, raising=False)
    assert chosen_loop() == chosen_loop("auto") == chosen_loop("uvloop") == "uvloop"
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert chosen_loop() == "asyncio", "$TIMERS_LOOP turns it off"
    assert chosen_loop("uvloop") == "uvloop", "the option wins over the environment"


def test_a_loop_that_cannot_be_had_is_refused(no_uvloop: None) -> None:
    with pytest.raises(ValueError, match=r"pip install 'redis-timers\[fast\]'"):
        chosen_loop("uvloop")
    with pytest.raises(ValueError, match="one of auto, asyncio, uvloop"):
        chosen_loop("trio")


@pytest.mark.parametrize("kind", ["asyncio", pytest.param("uvloop", marks=needs_uvloop)])
def test_run_runs_on_the_chosen_loop_with_the_callers_context(kind: str) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    var.set("from the caller")

    async def main() -> tuple[str, str, str]:
        child = await asyncio.create_task(asyncio.sleep(0, var.get()))
        return event_loop.loop_name(), var.get(), child

    assert event_loop.run(main(), kind) == (kind, "from the caller", "from the caller")


def test_an_unknown_loop_in_the_environment_stops_listen_before_it_starts(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOOP_ENV, "trio")
    code = run_app(app, ["listen"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("error: $TIMERS_LOOP: unknown event loop 'trio'"), err


def test_loop_asked_for_and_not_installed_stops_listen(
        capsys: pytest.CaptureFixture[str], no_uvloop: None) -> None:
    code = run_app(app, ["listen", "--loop", "uvloop"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("error: --loop: the uvloop event loop is not installed"), err
