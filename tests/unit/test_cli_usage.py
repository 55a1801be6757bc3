"""Usage errors as a user meets them: a bad value of an option exits 2 naming the option;
an option named as other tools name it gets the one it means here, with an example; help
is as wide as the terminal ($COLUMNS); option values are converted with a message that says
what they must be (:mod:`timers.cli.coerce`)."""

from __future__ import annotations

import pytest

from timers.cli import app
from timers.cli.errors import run_app


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_app(app, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("argv", "said"), [
    (["schedule", "x.y", "--in", "3x"], "invalid value for '--in': cannot read duration '3x'"),
    (["reschedule", "id-1", "--in", "soon"], "invalid value for '--in': cannot read duration"),
    (["schedule", "x.y", "--at", "tomorrow"], "invalid value for '--at': 'tomorrow' is not an "
                                              "ISO 8601 time"),
    (["schedule", "x.y", "--at", "2026-01-01T09:00"], "invalid value for '--at': "
                                                      "'2026-01-01T09:00' has no time zone"),
    (["history", "--since", "lately"], "invalid value for '--since': cannot read duration"),
])
def test_a_bad_due_time_or_duration_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {said}") and err.count("\n") == 1, err
    assert err.rstrip().endswith(f"(see timers {argv[0]} --help)")


@pytest.mark.parametrize(("argv", "meant"), [
    (["schedule", "x.y", "--delay", "3s"], "did you mean --in? e.g. --in 3s"),
    (["schedule", "x.y", "--countdown=3"], "did you mean --in? e.g. --in 3s"),
    (["schedule", "x.y", "--dela", "3s"], "did you mean --in? e.g. --in 3s"),
    (["reschedule", "i", "--eta", "2030-01-01T00:00:00Z"], "did you mean --at?"),
    (["listen", "--redis-url", "redis://h"], "did you mean --url?"),
    (["listen", "--task", "myapp.tasks"], "did you mean --tasks? e.g. --tasks myapp.tasks"),
    (["schedule", "x.y", "--prioirty", "3"], "did you mean --priority?"),
    (["list", "--limt", "3"], "did you mean --limit?"),
])
def test_a_mistyped_option_gets_the_one_it_means(
        capsys: pytest.CaptureFixture[str], argv: list[str], meant: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and meant in err and err.count("\n") == 1, err
    assert "--key" not in err and "Possible options" not in err


def test_an_option_like_nothing_here_is_named_alone(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "schedule", "x.y", "--xyz", "1")
    assert code == 2
    assert err == "error: no such option: --xyz (see timers schedule --help)\n"


def test_help_is_as_wide_as_the_terminal(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    _, wide, _ = run(capsys, "--help")
    demo = next(line for line in wide.splitlines() if line.strip().startswith("demo "))
    assert demo.rstrip().endswith("removes its keys when done.")  # whole, not cut at ~55
    assert max(len(line) for line in wide.splitlines()) > 100
    monkeypatch.setenv("COLUMNS", "60")
    _, narrow, _ = run(capsys, "--help")
    assert max(len(line) for line in narrow.splitlines()) <= 60
    _, schedule, _ = run(capsys, "schedule", "--help")
    assert max(len(line) for line in schedule.splitlines()) <= 60


@pytest.mark.parametrize(("argv", "said"), [
    (["demo", "--count", "x"], "invalid value for '--count': 'x' is not a whole number"),
    (["demo", "--count", "0"], "invalid value for '--count': must be at least 1, got 0"),
    (["web", "--port", "70000"], "invalid value for '--port': must be at most 65535, got 70000"),
    (["listen", "--shutdown-timeout", "soon"], "invalid value for '--shutdown-timeout': 'soon' "
                                               "is not a number"),
    (["listen", "--log-level", "loud"], "invalid value for '--log-level': 'loud' is not one of "
                                        "'debug', 'info', 'warning', 'error'"),
])
def test_a_bad_option_value_says_what_it_must_be(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith(f"error: {said} (see timers {argv[0]} --help)"), err


def test_plain_values_are_converted_as_before() -> None:
    from timers.cli.app import load_commands
    from timers.cli.coerce import PlainValue

    listen = load_commands("timers.cli.listen", "register")["listen"]
    ctx = listen.make_context("listen", ["--concurrency", "7", "--shutdown-timeout", "inf",
                                         "--group", "a", "--group", "b", "--log-level", "debug"])
    assert ctx.params["concurrency"] == 7 and ctx.params["shutdown_timeout"] == float("inf")
    assert ctx.params["group"] == ["a", "b"] and ctx.params["log_level"] == "debug"
    kinds = {p.name: type(p._runtime_param) for p in listen.params}  # type: ignore[attr-defined]
    assert kinds["concurrency"] is PlainValue and kinds["group"] is PlainValue


@pytest.mark.parametrize("setup", ["nocolon", "app.main:", "bad path:setup", ":setup"])
def test_a_setup_that_cannot_name_a_function_is_refused_before_anything_starts(
        capsys: pytest.CaptureFixture[str], setup: str) -> None:
    # (the URL answers nothing, and is not waited for: a refusal comes before it is tried)
    code, _, err = run(capsys, "listen", "--setup", setup, "--url", "redis://127.0.0.1:1/0",
                       "--wait-for-redis", "0")
    assert (code, err) == (1, f"error: setup {setup!r} must look like "
                              "'package.module:function'\n")
