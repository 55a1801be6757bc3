"""The command line as a new user meets it, without a server: errors, help, parsing."""

from __future__ import annotations

import contextlib
import io
from datetime import UTC, datetime

import pytest
import typer

from timers.cli import app
from timers.cli.common import clip, printable
from timers.cli.errors import run_app
from timers.exceptions import InvalidDueTime
from timers.model.due import due_spec, parse_delay
from timers.model.redact import mask_secrets, safe_url

COMMANDS = [["listen"], ["schedule"], ["reschedule"], ["cancel"], ["get"], ["list"],
            ["listeners"], ["stats"], ["check"], ["demo"], ["server"], ["failed"],
            ["failed", "list"], ["failed", "show"], ["failed", "retry"], ["failed", "purge"],
            ["cron"], ["cron", "add"], ["cron", "list"], ["cron", "remove"], ["cron", "pause"],
            ["cron", "resume"]]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run_app(app, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "╭" not in err and "│" not in err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["schedule", "x", "--in"],                   # option without its value
    ["schedule", "x", "--bogus"],                # unknown option
    ["listen", "--log-level", "chatty"],         # not one of the choices
    ["listen", "--concurrency", "0"],            # out of range
    ["nosuchcommand"],
    ["get"],                                     # missing argument
    ["schedule", "reminders.sms", "--in", "soon"],                # bad duration
    ["schedule", "reminders.sms", "--at", "2026-01-01T00:00:00"],  # no zone
])
def test_usage_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                              argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    one_error_line(err)


def test_log_level_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run(capsys, "listen", "--log-level", "chatty")
    assert "chatty" in err and "debug" in err and "warning" in err


@pytest.mark.parametrize("argv", [  # (no --in/--at, bad JSON: usage errors, test_cli_edges)
    ["history", "--url", "notaurl://x"],                          # a URL no client takes
])
def test_other_errors_are_one_line_and_exit_1(capsys: pytest.CaptureFixture[str],
                                              argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 1
    one_error_line(err)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("timers ")


def test_no_arguments_shows_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 0 and "Usage: timers" in out and "server" in out


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_reads_plainly(capsys: pytest.CaptureFixture[str], path: list[str]) -> None:
    code, out, err = run(capsys, *path, "--help")
    assert code == 0, err
    usage = out.splitlines()[0]
    assert usage.startswith("Usage: timers"), out
    for odd in ("{", "[[", "<"):
        assert odd not in usage, (odd, usage)
    for odd in ("<bool>", "<str>", "╭", " ,"):
        assert odd not in out, (odd, out)
    if "--url" in out:
        assert "$TIMERS_REDIS_URL" in out and "redis://localhost:6379/0" in out
    if path not in (["cron"], ["server"]):
        assert "--prefix" in out, "every command takes --prefix"


def test_tasks_help_names_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "listen", "--help")
    assert "$TIMERS_TASKS or tasks" in " ".join(out.split())


def test_reschedule_takes_in_or_at(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "reschedule", "--help")
    assert "Usage: timers reschedule [OPTIONS] ID" in out
    assert "--in DURATION" in out and "--at TIME" in out


def test_negative_delay_is_due_now() -> None:
    assert parse_delay("-5s") == -5.0
    assert parse_delay("-1m30s") == -90.0
    assert due_spec(parse_delay("-5s"), None) == ("in", -5000)


def test_at_is_capped_like_in() -> None:
    with pytest.raises(InvalidDueTime, match="hundred years"):
        due_spec(None, datetime(9999, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidDueTime, match="hundred years"):
        due_spec(101 * 366 * 86400.0, None)
    assert due_spec(None, datetime(2100, 1, 1, tzinfo=UTC))[0] == "at"


def test_control_characters_are_escaped_and_cuts_marked() -> None:
    assert printable("a\nb\tc\x1b") == "a\\nb\\tc\\x1b"
    assert clip("x" * 10, 5) == "xxxx…"
    assert clip("short", 5) == "short"


@pytest.mark.parametrize("url", [
    "redis://:sekret@host:6379/0", "redis://user:sekret@host/0", "rediss://sekret@host",
    "redis://host/0?password=sekret&db=1", "unix://user:sekret@/tmp/redis.sock",
])
def test_passwords_are_masked(url: str) -> None:
    assert "sekret" not in safe_url(url)
    assert "sekret" not in mask_secrets(f"cannot connect to Redis at {url}: refused")
    assert "host" in safe_url(url) or "sock" in safe_url(url)


def test_urls_without_password_are_unchanged() -> None:
    assert safe_url("redis://localhost:6379/0") == "redis://localhost:6379/0"


def test_an_escaping_timers_error_is_one_masked_line() -> None:
    """A TimersError escaping a command is one line too, its credentials masked."""
    sub = typer.Typer()

    @sub.command()
    def boom() -> None:
        from timers.exceptions import TimersError
        raise TimersError("redis://u:sekret@h/0 said no\nsecond line")

    @sub.command()
    def other() -> None:  # two commands make a group: `boom` is a command name
        pass

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert run_app(sub, ["boom"]) == 1
    assert err.getvalue().count("\n") == 1 and "sekret" not in err.getvalue()


@pytest.mark.parametrize(("argv", "hint"), [
    (["schedule", "x", "--in"], "(see timers schedule --help)"),
    (["cron", "add", "x", "--every"], "(see timers cron add --help)"),
    (["listen", "--log-level", "chatty"], "(see timers listen --help)"),
])
def test_usage_errors_name_the_help_of_their_command(
        capsys: pytest.CaptureFixture[str], argv: list[str], hint: str) -> None:
    _, _, err = run(capsys, *argv)
    assert one_error_line(err).endswith(hint)
    assert "Value error" not in err
