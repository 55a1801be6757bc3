"""The log options of ``timers listen`` and the lines the command itself writes.

``--log-format text|json`` (or ``$TIMERS_LOG_FORMAT``) and ``--log-fires`` are set up here
(the formats are in :mod:`timers.logs`); a supervisor passes them to its children.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Annotated

import typer

from timers.cli.common import ERRORS
from timers.exceptions import UserError
from timers.logs import (
    IDENTITY,
    LOG_FORMAT_ENV,
    LogFormat,
    configure,
    configured_format,
    identify,
)

if TYPE_CHECKING:
    from timers.listener import Listener
    from timers.listener.supervision.supervisor import Supervisor

log = logging.getLogger("timers.listener.supervision.supervisor")

LogFormatOption = Annotated[str | None, typer.Option(
    "--log-format", metavar="<text|json>", show_default=False,
    help=f"Log lines as text, or as one JSON object per line "
         f"[default: ${LOG_FORMAT_ENV} or text]")]
LogFiresOption = Annotated[bool, typer.Option(
    "--log-fires", help="Log one INFO line per fired timer: id, task, lateness, duration, "
                        "outcome.")]


def set_up_logs(level: str, log_format: str | None, processes: int) -> LogFormat:
    """Log to stderr as asked; a one-line error for a bad format."""
    try:
        chosen = configured_format(log_format)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    configure(level, chosen, role="supervisor" if processes > 1 else "listener")
    ERRORS.as_json = chosen == "json"
    return chosen


def listener_logs(listener: Listener, log_fires: bool) -> None:
    """From here on, lines carry the listener's id; fired timers are logged if asked."""
    identify(listener.id)
    listener.tally.log_fires = log_fires


def supervise(supervisor: Supervisor) -> int:
    """Run ``supervisor`` and say when it stops."""
    IDENTITY.role = "supervisor"  # also for one process supervised to be recycled
    started = time.monotonic()
    code = supervisor.run()
    log.info("stopped: supervisor of %d listener process(es), exit code %d, up %.1f s",
             supervisor.processes, code, time.monotonic() - started,
             extra={"exit_code": code, "uptime_s": round(time.monotonic() - started, 3)})
    return code
