"""``timers move``: move timers of chosen tasks to another prefix (see
:mod:`timers.ops.moves`). Parse and print only."""

from __future__ import annotations

from typing import Annotated

import typer

from timers.cli.common import PrefixOption, UrlOption, friendly, open_timers
from timers.exceptions import UserError
from timers.model.keys import DEFAULT_PREFIX, check_prefix
from timers.ops.moves import move_timers
from timers.store.cluster import hash_tagged, is_cluster, keyspace_for


def _tag(prefix: str) -> str:
    """The hash tag a cluster's keys of ``prefix`` share."""
    tagged = hash_tagged(prefix)
    start = tagged.find("{")
    return tagged[start + 1:tagged.find("}", start + 2)]


def move(
    to_prefix: Annotated[str, typer.Option(
        "--to-prefix", metavar="PREFIX", help="The prefix to move the timers to.")],
    task: Annotated[list[str] | None, typer.Option(
        "--task", metavar="TASK", help="Move the timers of this task (repeat for several; "
        "default: every task).")] = None,
    dead: Annotated[bool, typer.Option(
        "--dead", help="Also move the records of dead timers of those tasks.")] = False,
    url: UrlOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
) -> None:
    """Move pending timers (and with --dead, dead ones) of chosen tasks from the prefix to
    another on the same server, each timer atomically: apps that shared a prefix by mistake
    get one each. Run it again to move timers that were running meanwhile."""
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
        done = t.run(move_timers(source, target, task or (), dead))
    line = f"moved {done.moved} pending timer(s)"
    if dead:
        line += f" and {done.dead_moved} dead one(s)"
    line += f" from {prefix!r} to {to_prefix!r}"
    if done.held:
        line += (f"; left {done.held} a concurrency key or rate limit holds back (run it "
                 f"again once they are due again)")
    if done.taken:
        line += f"; left {done.taken} whose id {to_prefix!r} has already"
    typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add ``timers move`` to the command line."""
    app.command("move")(friendly(move))
