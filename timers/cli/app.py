"""The ``timers`` command line: parses, calls the library, prints.

A usage error (an unknown option, a missing argument, a bad choice, ARGS_JSON that does
not parse, neither or both of --in and --at) prints one line and exits 2; any other error
(a bad duration, a server that does not answer) prints one line and exits 1. No
tracebacks, no boxes, no passwords.

The commands are loaded on demand. :data:`COMMANDS` names each command and the module that
defines it; the root group imports that module only when the command is run or its help
is shown. So ``timers --version`` and ``timers schedule --help`` start about as fast as
Python imports redis and typer, and ``timers schedule`` never loads the listener's
machinery (only ``timers listen`` does). ``timers --help`` lists every command, so it loads
them all.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup, TyperOption

from timers import __version__
from timers.cli.errors import run_app

if TYPE_CHECKING:
    from typer._click import Command, Context  # the Click that typer runs on (vendored)

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
    return dict(group.commands)


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

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        """``--help``, with False (not None) when absent: typer coerces a flag's value
        unless it is a bool, and its coercion imports pydantic (a third of the start-up
        time of ``timers schedule --help``)."""
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option


app = typer.Typer(
    cls=LazyGroup,
    help=HELP,
    no_args_is_help=True,
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
