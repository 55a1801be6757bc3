"""Events: how many ``expired`` events come within 100 ms of their timer's due time while a
million timers are pending a day out, with and without the near horizon.

Redis finds expired keys by sampling keys that have a TTL (``hz`` times a second). With
every pending timer keyed, 1,000,000 keys a day out drown the 2,000 that are due, and
their events come seconds to minutes late; with the near horizon (timers a day out have
no key yet) only the near keys are sampled. A subscriber of its own takes the events (no
listener: nothing claims the timers first), at ``hz 10`` (Redis's default) and ``hz 100``
(this repository's redis.conf). The 2,000 are due over 10 s, starting 2 s out.
"""

from __future__ import annotations

import threading
import time

import redis

from bench.common import PREFIX, Deadline, Row, count
from bench.context import Context
from timers import TimerSpec
from timers.model.keys import Keyspace

DAY = 86_400.0
DUE_N = 2_000
SPREAD_S = 10.0
LEAD_S = 2.0
WITHIN_MS = 100


def budget(ctx: Context) -> float:
    return 2 * ctx.sizes.idle_n / 10_000 + 4 * (LEAD_S + SPREAD_S + 5) + 60


def run(ctx: Context) -> None:
    n = ctx.sizes.idle_n
    keys = Keyspace(PREFIX)
    for horizon in ("none", "1 h"):
        ctx.fresh_db(aof=False)
        if horizon == "none":  # every timer keyed, as before the near horizon
            ctx.r.hset(keys.near, "horizon", str(int(2 * DAY * 1000)))
        loaded, _ = ctx.bulk_load(n, in_=DAY, deadline=Deadline(n / 5_000 + 30))
        for hz in (10, 100):
            ctx.r.config_set("hz", hz)
            share, late_p50 = _share_on_time(ctx, keys, f"h{horizon[0]}z{hz}")
            name = (f"Events: {count(DUE_N)} due over {SPREAD_S:g} s, {count(loaded)} pending "
                    f"a day out, hz {hz}, near horizon {horizon}")
            print(f"- {name}", flush=True)
            ctx.results.add(Row(name, f"expired events within {WITHIN_MS} ms of due",
                                f"{share:.1%} (event lateness p50 {late_p50:,.0f} ms)"))
    ctx.r.config_set("hz", 100)


def _share_on_time(ctx: Context, keys: Keyspace, tag: str) -> tuple[float, float]:
    """Schedule the due timers, take their events for the spread plus 3 s; the share that
    came within WITHIN_MS of due, and the p50 lateness of those that came."""
    arrived: dict[str, float] = {}
    pubsub = redis.Redis.from_url(ctx.url, decode_responses=True).pubsub()
    pubsub.subscribe("__keyevent@0__:expired")
    stop = threading.Event()

    def take() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.05)
            if message and message["type"] == "message":
                arrived.setdefault(message["data"], time.time() * 1000)

    reader = threading.Thread(target=take, daemon=True)
    reader.start()
    with ctx.timers() as t:
        ids = t.schedule_many([TimerSpec("reminders.sms", [i], id=f"{tag}-{i}",
                                         in_=LEAD_S + SPREAD_S * i / DUE_N)
                               for i in range(DUE_N)])
    seconds, micros = ctx.r.time()
    offset = time.time() * 1000 - (int(seconds) * 1000 + int(micros) / 1000)
    records = ctx.r.hmget(keys.records, ids)
    dues = ctx.r.zmscore(keys.due, ids)
    time.sleep(LEAD_S + SPREAD_S + 3)
    stop.set()
    reader.join()
    pubsub.close()
    lateness = []
    for timer_id, record, due in zip(ids, records, dues, strict=True):
        when = arrived.get(keys.timer_key(f"{timer_id}:{record}"))
        if when is not None and due is not None:
            lateness.append(when - offset - due)
    on_time = sum(1 for late in lateness if late <= WITHIN_MS)
    lateness.sort()
    return on_time / DUE_N, lateness[len(lateness) // 2] if lateness else float("nan")
