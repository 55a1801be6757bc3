"""The ``timers`` command line: parses, calls the library, prints.

A usage error (an unknown option, with the one meant, a missing argument, a bad choice or
value, ARGS_JSON that does not parse, neither or both of --in and --at, a bad duration or
time) prints one line and exits 2; any other error (a server that does not answer) prints
one line and exits 1. No
tracebacks, no boxes, no passwords.

The commands are loaded on demand. :data:`COMMANDS` names each command and the module that
defines it; the root group imports that module only when the command is run or its help
is shown. So ``timers --version`` and ``timers schedule --help`` start about as fast as
Python imports redis and typer, and ``timers schedule`` never loads the listener's
machinery (only ``timers listen`` does). ``timers --help`` lists every command from
:data:`SUMMARIES`, loading none. Values are converted without Pydantic
(:mod:`timers.cli.coerce`), and help is as wide as the terminal.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main
from typer._click.utils import make_default_short_help
from typer.core import TyperGroup, TyperOption

from timers import __version__
from timers.cli.coerce import plain_values
from timers.cli.errors import run_app

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter  # (typer's vendored Click)

COMMANDS: dict[str, tuple[str, str]] = {
    "server": ("timers.cli.server", "register"),
    "demo": ("timers.cli.server", "register"),
    "check": ("timers.cli.server", "register"),
    "listen": ("timers.cli.listen", "register"),
    "schedule": ("timers.cli.produce", "register"),
    "reschedule": ("timers.cli.produce", "register"),
    "cancel": ("timers.cli.produce", "register"),
    "get": ("timers.cli.views", "register"),
    "list": ("timers.cli.views", "register"),
    "listeners": ("timers.cli.views", "register"),
    "stats": ("timers.cli.views", "register"),
    "history": ("timers.cli.history", "register"),
    "failed": ("timers.cli.failed", "failed_app"),
    "cron": ("timers.cli.cron", "cron_app"),
    "top": ("timers.cli.top", "register"),
    "metrics": ("timers.cli.observe", "register"),
    "web": ("timers.cli.web", "register"),
    "move": ("timers.cli.move", "register"),
}
"""Each command (in the order ``timers --help`` lists them): the module that defines it
and either that module's ``register(app)`` function or its command group (a
``typer.Typer``)."""

SUMMARIES: dict[str, str] = {
    'server': ("Run a Redis server with timers' redis.conf in the foreground, until "
               'Ctrl-C.'),
    'demo': ('Start a listener (on an embedded Redis unless a URL is configured) and '
             'fire timers; removes its keys when done.'),
    'check': 'Check that a server will fire timers reliably; exits 1 if it will not.',
    'listen': ('Run timers as they come due (subscribes to expired events and sweeps '
               'the due index).'),
    'schedule': 'Schedule a timer; prints its id.',
    'reschedule': ('Move a pending timer to a new due time; exits 1 if it is not '
                   'pending.'),
    'cancel': 'Cancel a pending timer; exits 1 if it was not pending.',
    'get': ('Show where a timer is: pending or waiting (and on what), running (where),'
            ' or how it ended (completed, skipped, dead, cancelled); exits 1 if timers'
            ' knows nothing of it (never existed, or ended longer ago than the history'
            ' keeps).'),
    'list': ('List pending timers, soonest first (waiting ones say what they wait '
             'for).'),
    'listeners': ('List live listeners (from their heartbeats) and the groups each '
                  'serves.'),
    'stats': ('Counts: pending, running, failed, fired; per group; timers waiting per '
              'key/rate.'),
    'history': ('List timers that ended (completed, skipped, dead, cancelled), newest '
                'first: how, when, on which listener, attempts, run time and lateness '
                'in ms, and the error of a dead one.'),
    'failed': 'Timers that failed or were refused.',
    'cron': 'Recurring timers: cron expressions in a time zone, or fixed intervals.',
    'top': ('A live view of pending, due, overdue and running timers, fires per '
            'second, lateness, the busiest tasks and the listeners.'),
    'metrics': ("Serve the keyspace's state (pending, overdue, dead, listeners …) as "
                'Prometheus metrics, read from Redis at each scrape, until Ctrl-C.'),
    'web': ('Serve a dashboard of the keyspace: overview with charts, pending timers '
            "of every group, a timer's page with cancel / reschedule / run now, a page"
            ' per task (its limits and what waits on them), run history, dead timers '
            'with retry and purge, recurrences.'),
    'move': ('Move pending timers (and with --dead, dead ones) of chosen tasks from '
             'the prefix to another on the same server, each timer atomically: apps '
             'that shared a prefix by mistake get one each.'),
}
"""Each command's one-line summary (the first sentence of its help) for ``timers --help``,
which so loads no command module; ``tests/unit/test_cli_lazy.py`` checks each against
its command."""

HELP = "Delayed timers on Redis: schedule a task call for later; listeners fire it once."


def load_commands(module_name: str, attribute: str) -> dict[str, Command]:
    """The commands a module of :data:`COMMANDS` defines, as Click commands by name."""
    found = getattr(importlib.import_module(module_name), attribute)
    holder = typer.Typer(add_completion=False, rich_markup_mode=None)
    holder.callback()(_no_options)  # a group even for one command
    if isinstance(found, typer.Typer):
        names = [name for name, place in COMMANDS.items()
                 if place == (module_name, attribute)]
        holder.add_typer(found, name=names[0])
    else:
        found(holder)
    group = typer.main.get_group(holder)
    _plain_everywhere(group.commands.values())
    return dict(group.commands)


def _plain_everywhere(commands: Iterable[Command]) -> None:
    """Plain values converted without Pydantic (:mod:`timers.cli.coerce`), in every
    command and subcommand, their ``--help`` included (see
    :meth:`LazyGroup.get_help_option`)."""
    for command in commands:
        plain_values(command.params)
        _help_is_a_bool(command.get_help_option(typer.core.TyperGroup.context_class(command)))
        _plain_everywhere(getattr(command, "commands", {}).values())


def _help_is_a_bool(option: TyperOption | None) -> None:
    """``--help`` with False (not None) when absent: typer converts a flag's value unless
    it is a bool, and its conversion imports Pydantic, a large share of the start-up
    time of ``timers schedule`` (figures: bench/FINDINGS.md, "Start-up CPU")."""
    if option is not None and option.default is None:
        option.default = False


def _no_options() -> None:
    """(The root of a module's commands while they are loaded: never run.)"""


class CommandTable(MutableMapping[str, "Command"]):
    """The root group's commands: every name of :data:`COMMANDS` from the start (so usage
    errors can suggest any of them), each command loaded on its first lookup."""

    def __init__(self, loaded: MutableMapping[str, Command]) -> None:
        self._loaded = dict(loaded)

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded and name in COMMANDS:
            self._loaded.update(load_commands(*COMMANDS[name]))
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._loaded if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self._loaded.keys())


class LazyGroup(TyperGroup):
    """The ``timers`` group: its commands are a :class:`CommandTable`."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = CommandTable(self.commands)

    def list_commands(self, ctx: Context) -> list[str]:
        """Every command's name, without loading any."""
        return list(self.commands)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The command list of ``timers --help`` from :data:`SUMMARIES`, as wide as the
        help (no command is loaded)."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        with formatter.section("Commands"):
            formatter.write_dl([(name, make_default_short_help(SUMMARIES[name], limit))
                                for name in COMMANDS])

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        """``--help``, a bool (:func:`_help_is_a_bool`)."""
        option = super().get_help_option(ctx)
        _help_is_a_bool(option)
        return option


WIDEST = 200
"""Help is as wide as the terminal ($COLUMNS, else the terminal's own), up to this."""

app = typer.Typer(
    cls=LazyGroup,
    help=HELP,
    no_args_is_help=True,
    context_settings={"max_content_width": WIDEST},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"timers {__version__}")  # the distribution's (pyproject reads it)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Delayed timers on Redis: schedule a task call for later; listeners fire it once."""


def main() -> None:
    """The ``timers`` command: exit 2 on a usage error, 1 on any other error."""
    sys.exit(run_app(app))


if __name__ == "__main__":  # pragma: no cover
    main()
