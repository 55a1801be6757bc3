"""``timers move``: move timers of chosen tasks to another prefix (see
:mod:`timers.ops.moves`). Parse and print only."""

from __future__ import annotations

from typing import Annotated

import typer

from timers.cli.common import PrefixOption, UrlOption, friendly, open_timers
from timers.exceptions import UserError
from timers.model.keys import DEFAULT_PREFIX, check_prefix
from timers.ops.moves import MOVE_WAIT_S, MoveSummary, move_all
from timers.store.cluster import hash_tagged, is_cluster, keyspace_for


def _tag(prefix: str) -> str:
    """The hash tag a cluster's keys of ``prefix`` share."""
    tagged = hash_tagged(prefix)
    start = tagged.find("{")
    return tagged[start + 1:tagged.find("}", start + 2)]


def summary_line(done: MoveSummary, prefix: str, to_prefix: str, dead: bool) -> str:
    """What a move did and what it left, with each reason's count, in one line."""
    line = f"moved {done.moved} pending timer(s)"
    if dead:
        line += f" and {done.dead_moved} dead one(s)"
    line += f" from {prefix!r} to {to_prefix!r}, left {done.left}"
    reasons = [(done.held, "held by a concurrency key or rate limit"),
               (done.taken, f"id taken under {to_prefix!r}"),
               (done.running, f"still running under {prefix!r}")]
    if done.left:
        line += " (" + ", ".join(f"{why}: {n}" for n, why in reasons if n) + ")"
    if done.held or done.running:
        line += "; run it again to move those that are pending by then"
    return line


def move(
    to_prefix: Annotated[str, typer.Option(
        "--to-prefix", metavar="PREFIX", help="The prefix to move the timers to.")],
    task: Annotated[list[str] | None, typer.Option(
        "--task", metavar="TASK", help="Move the timers of this task (repeat for several; "
        "default: every task).")] = None,
    dead: Annotated[bool, typer.Option(
        "--dead", help="Also move the records of dead timers of those tasks.")] = False,
    wait: Annotated[float, typer.Option(
        "--wait", metavar="SECONDS", min=0,
        help="How long to wait for runs of those tasks in flight under the prefix to end "
        "or come back pending (then moved); those still running after it are left and "
        "counted.")] = MOVE_WAIT_S,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Move pending timers (and with --dead, dead ones) of chosen tasks from the prefix to
    another on the same server, each timer atomically: apps that shared a prefix by mistake
    get one each. Walks again until nothing is left to move, and prints how many it moved
    and how many it left, by reason; running it again is safe and moves only what is left.
    Refuses a task no live listener of the new prefix runs while some are live."""
    from timers.ops.fleet import read_fleet

    try:
        check_prefix(to_prefix, "--to-prefix")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    with open_timers(url, prefix) as t:
        source, target = t.keys, keyspace_for(t.redis, to_prefix)
        if source.prefix == target.prefix:
            raise UserError("--to-prefix names the prefix the timers are in already")
        if is_cluster(t.redis) and _tag(prefix) != _tag(to_prefix):
            raise UserError(
                f"on Redis Cluster the two prefixes must share a hash tag ({{{_tag(prefix)}}}"
                f" and {{{_tag(to_prefix)}}} differ): a script cannot write both")
        for keys in (source, target):
            shards = t.redis.get(keys.shards)
            if shards is not None and int(shards) > 1:
                raise UserError(f"prefix {keys.prefix!r} is split into {int(shards)} shards: "
                                f"timers move works on prefixes of one shard")
        fleet = t.run(read_fleet(target))
        for name in task or ():
            if not fleet.may_run_anywhere(name):
                raise UserError(f"no live listener of {to_prefix!r} runs {name!r} "
                                f"({fleet.describe()}): its timers would be refused there; "
                                f"start one that does first")
        done = move_all(t.run, source, target, task or (), dead, wait)
    typer.echo(summary_line(done, prefix, to_prefix, dead))


def register(app: typer.Typer) -> None:
    """Add ``timers move`` to the command line."""
    app.command("move")(friendly(move))
