"""What the run history costs in Redis: ``python -m bench.history_cost [--n 1000000]``.

Starts its own server (the repository's redis.conf) and prints:

- bytes per kept history record (``MEMORY USAGE`` of ``P|hist`` + ``P|histexp`` +
  ``P|histb`` + ``P|histrec``, every element sampled, over N records written as the
  listener writes them, in batches of ``--batch`` records: one per finish call);
- a finish call of 500 ended runs (``finish.lua``, one batch) with history and series on
  and off, at an empty history and at N records: its time in Redis (``INFO
  commandstats``), median of the rounds;
- the cleanup: N records dropped by the trim finish.lua runs (``history.lua``), in calls
  of 1,008 (what a batch of 500 endings may trim), the time per call and in all, and one
  count trim of 1,008 records at N: O(log n) per batch, so flat in N.
- a series ring of a task that ran every minute for 24 h: bytes (``MEMORY USAGE``).
- a task's own count (``@task(history_count=N)``): bytes per kept record with and without
  one, ``--counted`` records written through finish.lua in calls of 500 endings (with one,
  N large enough to keep them all: the task's zset then holds one entry per record).

Records carry a generated id, ``reminders.sms``, this host's listener id and small
numbers: a completed run's record (a dead one adds up to 200 characters of error).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from importlib import resources
from typing import Any

import redis

from timers.dev.server import EmbeddedServer
from timers.model.history import EndKind, HistoryRecord, MinuteSlot
from timers.model.keys import Keyspace
from timers.model.timer_ids import new_timer_id
from timers.store.scripts import PRELUDES, NewTimer, ScriptCalls, source

KS = Keyspace("bench")
LISTENER = f"{socket.gethostname()}:{os.getpid()}:a1b2c3"
BATCH = 500
HISTORY_KEYS = (KS.history, KS.history_expiry, KS.history_batches, KS.history_records)
TRIM = 2 * BATCH + 8


def record_text(ended_ms: int) -> str:
    return HistoryRecord("", "reminders.sms", EndKind.COMPLETED, ended_ms / 1000, LISTENER,
                         3, 1, 12).encode()


def fill(r: redis.Redis, n: int, ended_ms: int, batch: int) -> None:
    """N records, as finish.lua writes them (``history.lua``: per record an HSET field
    prefixed by its batch; per batch of ``batch`` records a ``P|hist`` and a ``P|histexp``
    entry and a ``P|histb`` field), oldest first, each kept the default 7 days."""
    step = 10_000 // batch * batch
    for start in range(0, n, step):
        pipe = r.pipeline(transaction=False)
        ids = [new_timer_id() for _ in range(min(step, n - start))]
        first = int(r.incrby(KS.sequence, len(ids))) - len(ids)  # batch ids: a run token each
        groups = {f":{first + k + 1}": ids[k:k + batch] for k in range(0, len(ids), batch)}
        pipe.zadd(KS.history, {b: ended_ms - n + start + k
                               for k, b in enumerate(groups)})
        pipe.zadd(KS.history_expiry, {b: ended_ms - n + start + k + 7 * 86_400_000
                                      for k, b in enumerate(groups)})
        pipe.hset(KS.history_batches, mapping={b: ":".join(g) for b, g in groups.items()})
        pipe.hset(KS.history_records, mapping={i: f"{b}|{record_text(ended_ms)}"
                                               for b, g in groups.items() for i in g})
        pipe.execute()


def bytes_per_record(r: redis.Redis, n: int) -> float:
    used = sum(int(r.memory_usage(k, samples=0) or 0) for k in HISTORY_KEYS)
    return used / n


def redis_usec(r: redis.Redis, command: str = "cmdstat_evalsha") -> float:
    stats = r.info("commandstats").get(command, {})
    return float(stats.get("usec", 0)) if isinstance(stats, dict) else 0.0


def finish_batch(r: redis.Redis, calls: ScriptCalls, finish: Any, claim: Any, schedule: Any,
                 history: bool, keep: str = "") -> float:
    """Schedule, claim and finish BATCH runs; the finish call's Redis time in µs. ``keep``:
    each ending's keep value (``"|<count>"``: its task has a count of its own)."""
    ids = [new_timer_id() for _ in range(BATCH)]
    call = calls.schedule([NewTimer(i, "reminders.sms:[1]", "in", -1, "n") for i in ids])
    schedule(keys=list(call.keys), args=list(call.args))
    call = calls.claim(limit=BATCH, lease_ms=60_000, horizon_ms=0, listener_id=LISTENER)
    reply = claim(keys=list(call.keys), args=list(call.args))
    items = reply[3:]
    now_ms = int(time.time() * 1000)
    endings = []
    for k in range(0, len(items), 3):
        token, run = items[k].decode(), items[k + 1].decode()
        escaped = run.split("|", 2)[2].split(":", 1)[0]
        endings.append((token, "ok", "", "", escaped, record_text(now_ms), keep)
                       if history else (token, "ok", "", ""))
    slot = MinuteSlot(now_ms // 60_000, len(endings), 0, {2: len(endings)}, {1: len(endings)})
    call = calls.finish(retention_ms=86_400_000, endings=endings,
                        history=(7 * 86_400_000, 10**9) if history else (0, 0),
                        series=[("reminders.sms", slot.encode())] if history else [])
    before = redis_usec(r)
    finish(keys=list(call.keys), args=list(call.args))
    return redis_usec(r) - before


def counted_cost(r: redis.Redis, calls: ScriptCalls, scripts: tuple[Any, Any, Any],
                 n: int) -> None:
    """Bytes per kept record of ``n`` records written by finish.lua, without a task count
    and with one (that keeps them all); the history emptied before each."""
    task_zset = KS.history_task("reminders.sms")
    per = {}
    for label, keep in (("without a count", ""), ("with a count", f"|{10**9}")):
        r.delete(*HISTORY_KEYS, task_zset)
        for _ in range(n // BATCH):
            finish_batch(r, calls, *scripts, history=True, keep=keep)
        kept = int(r.hlen(KS.history_records))
        used = sum(int(r.memory_usage(k, samples=0) or 0) for k in (*HISTORY_KEYS, task_zset))
        per[label] = used / kept
        print(f"{kept:,} records written by finish.lua in calls of {BATCH}, {label}: "
              f"{per[label]:.1f} bytes a record (the task's zset: "
              f"{int(r.memory_usage(task_zset, samples=0) or 0) / kept:.1f})")
    print(f"a task's own count costs {per['with a count'] - per['without a count']:.1f} "
          "bytes a kept record")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", type=int, default=8,
                   help="records per history batch (per finish call) in the filled history")
    p.add_argument("--counted", type=int, default=5_000,
                   help="records written with and without a task count (0: skip)")
    p.add_argument("--counted-only", action="store_true",
                   help="measure only the task count's bytes per record")
    opts = p.parse_args()
    with EmbeddedServer() as server:
        r = redis.Redis.from_url(server.url)
        calls = ScriptCalls(KS)
        finish = r.register_script(source("finish"))
        claim = r.register_script(source("claim"))
        schedule = r.register_script(source("schedule"))
        print(f"server {server.version}; N = {opts.n:,}")
        if opts.counted:
            counted_cost(r, calls, (finish, claim, schedule), opts.counted)
            r.delete(*HISTORY_KEYS)
        if opts.counted_only:
            r.close()
            return

        def batches(label: str) -> None:
            for history in (True, False):
                took = [finish_batch(r, calls, finish, claim, schedule, history)
                        for _ in range(opts.rounds)]
                print(f"finish of {BATCH} runs, {label}, history+series "
                      f"{'on ' if history else 'off'}: median {statistics.median(took):,.0f} "
                      f"us in Redis (min {min(took):,.0f}, max {max(took):,.0f}), "
                      f"{statistics.median(took) / BATCH:.1f} us a run")

        batches("empty history")
        r.delete(*HISTORY_KEYS)
        now_ms = int(time.time() * 1000)
        began = time.monotonic()
        fill(r, opts.n, now_ms, opts.batch)
        print(f"filled {opts.n:,} records (batches of {opts.batch}) in "
              f"{time.monotonic() - began:.1f} s")
        print(f"bytes per kept record (MEMORY USAGE, every element): "
              f"{bytes_per_record(r, opts.n):.1f}")
        batches(f"{opts.n:,} records")

        # cleanup: everything past its age, trimmed as finish.lua trims (history.lua)
        trim = r.register_script(
            "#!lua flags=allow-oom\n" + "".join(
                resources.files("timers.store").joinpath("lua", f"{name}.lua").read_text("utf-8")
                for name in PRELUDES) +
            "history_trim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], tonumber(ARGV[1]), "
            "tonumber(ARGV[2]), tonumber(ARGV[3]))\nreturn redis.call('HLEN', KEYS[3])")
        trimmed = [KS.history, KS.history_expiry, KS.history_records, KS.history_batches]
        before, began, calls_made, left = redis_usec(r), time.monotonic(), 0, opts.n
        while left > 0:
            left = int(trim(keys=trimmed, args=[now_ms + 8 * 86_400_000, 10**9, TRIM]))
            calls_made += 1
        spent = redis_usec(r) - before
        print(f"cleanup of {opts.n:,} records past their age: {calls_made:,} trims of up to "
              f"{TRIM:,}, {spent / 1e6:.2f} s in Redis ({spent / calls_made / 1000:.2f} ms a "
              f"call, {spent / opts.n:.2f} us a record), {time.monotonic() - began:.1f} s "
              "wall")
        fill(r, opts.n, now_ms, opts.batch)
        before = redis_usec(r)
        left = int(trim(keys=trimmed, args=[now_ms, opts.n - TRIM, TRIM]))
        print(f"one count trim of {TRIM:,} at {opts.n:,} records: "
              f"{(redis_usec(r) - before) / 1000:.2f} ms in Redis ({left:,} left)")

        # a task's full ring
        r.delete(KS.series)
        last = now_ms // 60_000
        r.hset(KS.series, mapping={
            f"reminders.sms|{m % 1440}": MinuteSlot(m, 1000, 3, {2: 600, 3: 300, 5: 100},
                                                    {1: 500, 2: 400, 4: 100}).encode()
            for m in range(last - 1439, last + 1)})
        print(f"series ring of one task, 1,440 minutes: "
              f"{int(r.memory_usage(KS.series, samples=0) or 0):,} bytes")
        r.close()


if __name__ == "__main__":
    main()
