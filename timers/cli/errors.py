"""How the ``timers`` command ends: one plain line per error, exit 2 for usage errors.

Typer/Click would draw a box around a usage error, or print a traceback for an unexpected
one; here every error is one line, ``error: …``, with credentials masked (one JSON object
under ``timers listen --log-format json``).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping, Sequence

import typer
import typer.main
from typer._click.exceptions import NoSuchOption

from timers.cli.common import ERRORS
from timers.exceptions import TimersError

USAGE = 2
FAILURE = 1

MEANT: dict[str, tuple[str, str]] = {
    "--delay": ("--in", "--in 3s"), "--after": ("--in", "--in 3s"),
    "--countdown": ("--in", "--in 3s"), "--in_": ("--in", "--in 3s"),
    "--eta": ("--at", "--at 2026-12-01T09:00:00Z"), "--when": ("--at", "--at 2026-12-01T09:00:00Z"),
    "--time": ("--at", "--at 2026-12-01T09:00:00Z"),
    "--redis": ("--url", "--url redis://127.0.0.1:6379/0"),
    "--redis-url": ("--url", "--url redis://127.0.0.1:6379/0"),
    "--task": ("--tasks", "--tasks myapp.tasks"), "--package": ("--tasks", "--tasks myapp.tasks"),
    "--workers": ("--concurrency", "--concurrency 8"), "--token": ("--auth", "--auth TOKEN"),
}
"""Options other tools name differently: what the same thing is called here, with an
example (suggested only where the command has it)."""


def _no_such_option(exc: NoSuchOption) -> str:
    """What a mistyped option meant: the command's options closest to it, or the one other
    tools name so (``--delay``, ``--dela``: ``--in``, with an example)."""
    name = exc.option_name.split("=", 1)[0]
    command = getattr(exc.ctx, "command", None)
    options = {o for p in getattr(command, "params", ()) for o in getattr(p, "opts", ())
               if o.startswith("--") and o != "--help"}
    known = {k: v for k, v in MEANT.items() if v[0] in options}
    close = difflib.get_close_matches(name, sorted(options | known.keys()), n=3, cutoff=0.7)
    if close and close[0] in known:
        meant, example = known[close[0]]
        return f"no such option: {name}: did you mean {meant}? e.g. {example}"
    found = list(dict.fromkeys(known[c][0] if c in known else c for c in close))
    if found:
        return f"no such option: {name}: did you mean {' or '.join(found)}?"
    return f"no such option: {name}"


def _error(message: str) -> None:
    ERRORS.write(message)


def asks_for_json(args: Sequence[str], environ: Mapping[str, str] = os.environ) -> bool:
    """``timers listen`` with ``--log-format json`` (or ``$TIMERS_LOG_FORMAT=json`` and no
    ``--log-format``): then even an error before its logs are set up (a usage error, a
    bad option value) is written as JSON."""
    if next((arg for arg in args if not arg.startswith("-")), None) != "listen":
        return False
    from timers.logs import LOG_FORMAT_ENV  # (loaded by `timers listen` anyway)

    given = None
    for i, arg in enumerate(args):
        if arg == "--log-format" and i + 1 < len(args):
            given = args[i + 1]
        elif arg.startswith("--log-format="):
            given = arg.split("=", 1)[1]
    chosen = given if given is not None else environ.get(LOG_FORMAT_ENV, "")
    return chosen.strip().lower() == "json"


def _command_path(app: typer.Typer, args: list[str]) -> str:
    """``timers cron add`` for ``["cron", "add", "x", "--bad"]``: the command words."""
    words = ["timers"]
    command: object = typer.main.get_command(app)
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        command = sub
    return " ".join(words)


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    ERRORS.as_json = asks_for_json(args)
    try:
        result = app(args=args, prog_name="timers", standalone_mode=False)
    except typer.TyperException as exc:  # Click's ClickException and UsageError
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message())
            return 0
        message = (_no_such_option(exc) if isinstance(exc, NoSuchOption)
                   else exc.format_message().replace("Value error, ", "").rstrip("."))
        if exc.exit_code == USAGE:
            command = getattr(getattr(exc, "ctx", None), "command_path", None)
            _error(f"{message[:1].lower()}{message[1:]} "
                   f"(see {command or _command_path(app, args)} --help)")
            return USAGE
        _error(message)
        return exc.exit_code or FAILURE
    except typer.Abort:
        _error("aborted")
        return FAILURE
    except TimersError as exc:
        _error(str(exc))
        return FAILURE
    return result if isinstance(result, int) else 0
