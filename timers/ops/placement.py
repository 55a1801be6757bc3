"""Where a new timer goes among the shards of a prefix: the producer's side of the placement
rule of :mod:`timers.ops.shards` (:func:`placed`), applied by :mod:`timers.ops.sharded` to
every timer it writes."""

from __future__ import annotations

from timers.exceptions import InvalidTimer
from timers.model.encoding import Record, escape_id
from timers.model.flow.names import DEFAULT_GROUP
from timers.model.run_record import record_head, record_option
from timers.model.wire import Option
from timers.ops.operations import Prepared
from timers.ops.shards import id_in_shard, shard_of, shard_of_key


def declared_limit(record: str) -> str | None:
    """The name whose shard holds the limit a timer's task declares, when this process
    knows the declaration (the task registered by name, ``@timers.task(name=...)``): its
    rate's name, else its key (:meth:`TaskPolicy.limit_name`); None otherwise, for a task
    of another group than the timer's (it moves to its group first), or when the key
    function fails (the listener reports it)."""
    from timers.model.policy import registered_policy  # (only a sharded prefix asks)

    task, options = record_head(record)
    policy = registered_policy(task)
    if policy is None or not policy.flow_limited:
        return None
    group = (record_option(record, Option.GROUP) if options else None) or DEFAULT_GROUP
    if policy.group is not None and policy.group != group:
        return None
    try:
        return policy.limit_name(task, Record.decode(record).args)
    except Exception:
        return None


def placed(item: Prepared, count: int) -> Prepared:
    """``item`` with an id in the shard of its concurrency key, if it has one (the
    placement rule of :mod:`timers.ops.shards`): a generated id is drawn again until it falls
    there (every one, in turn, so a batch's ids still sort in its order); an id the
    producer chose that does not fall there is an :class:`InvalidTimer`. Without a key,
    a timer whose task's declared limit this process knows (:func:`declared_limit`) gets a
    generated id in its limit's shard; an id the producer chose stays in its own shard
    (the timer moves at its first claim)."""
    if count == 1:
        return item
    if item.route is None:
        name = None if item.replace else declared_limit(item.record)
        if name is None:
            return item
        fresh = id_in_shard(shard_of_key(name, count), count)
        return item._replace(timer_id=fresh, escaped=escape_id(fresh))
    shard = shard_of_key(item.route, count)
    if item.replace and shard_of(item.timer_id, count) == shard:
        return item
    if item.replace:
        raise InvalidTimer(
            f"timer id {item.timer_id!r} with key {item.route!r}: on {count} shards a keyed "
            f"timer lives in its key's shard, and its id must say so: put the key in "
            f"braces in the id (id={item.timer_id + '{' + item.route + '}'!r}), or let "
            f"timers make the id")
    fresh = id_in_shard(shard, count)
    return item._replace(timer_id=fresh, escaped=escape_id(fresh))
