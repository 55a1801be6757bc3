"""What the run history costs in Redis: ``python -m bench.history_cost [--n 1000000]``.

Starts its own server (the repository's redis.conf) and prints:

- bytes per kept history record (``MEMORY USAGE`` of ``P|hist`` + ``P|histexp`` +
  ``P|histb`` + ``P|histrec`` + the task's index ``P|hist|n|<task>`` + ``P|histf``, every
  element sampled, over N records written as the listener writes them, in batches of
  ``--batch`` records: one per finish call);
- a finish call of 500 ended runs (``finish.lua``, one batch) with history and series on
  and off, at an empty history and at N records: its time in Redis (``INFO
  commandstats``), median of the rounds;
- the cleanup: N records past their age dropped by ``trim.lua`` calls of the listener's
  budget (:data:`timers.listener.endings.history.TRIM_BUDGET`), the time per call and in all, and
  one count trim at N: O(log n) per batch, so flat in N.
- a series ring of a task that ran every minute for 24 h: bytes (``MEMORY USAGE``).
- bytes per kept record of ``--counted`` records written through finish.lua in calls of
  500 endings, with a task count of its own (``@task(history_count=N)``, N large enough to
  keep them all) and without: the task's zset, its index, holds one entry per record
  either way.

Records carry a generated id, ``reminders.sms``, this host's listener id and small
numbers: a completed run's record (a dead one adds up to 200 characters of error).

``--trim-idle COUNT``: only this. N records (one in 10,000 dead, ten of a rare task among
the oldest), the reads ``timers history --failed`` and ``--task`` of the rare task make
(timed), then a ``timers listen --history-count COUNT`` process with nothing to run: the
time till the history holds COUNT, and its trim calls as SLOWLOG times them (every call
logged), with the slowest command of any kind meanwhile.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from timers import Timers
from timers.dev.server import EmbeddedServer
from timers.listener.endings.history import TRIM_BUDGET
from timers.model.history import EndKind, HistoryRecord, MinuteSlot
from timers.model.keys import DEFAULT_PREFIX, Keyspace
from timers.model.timer_ids import new_timer_id
from timers.store.lua_source import script_library, source
from timers.store.script_calls import ScriptCalls
from timers.store.script_rows import NewTimer

KS = Keyspace("bench")
LISTENER = f"{socket.gethostname()}:{os.getpid()}:a1b2c3"
BATCH = 500
TASK = "reminders.sms"
RARE = "reports.yearly"
HISTORY_KEYS = (KS.history, KS.history_expiry, KS.history_batches, KS.history_records,
                KS.history_task(TASK), KS.history_failed)


def record_text(ended_ms: int, task: str = TASK, dead: bool = False) -> str:
    if dead:
        return HistoryRecord("", task, EndKind.DEAD, ended_ms / 1000, LISTENER, 3, 3, 12,
                             "TimeoutError: the gateway did not answer").encode()
    return HistoryRecord("", task, EndKind.COMPLETED, ended_ms / 1000, LISTENER,
                         3, 1, 12).encode()


def fill(r: redis.Redis, n: int, ended_ms: int, batch: int, ks: Keyspace = KS,
         dead_every: int = 0, rare_every: int = 0) -> None:
    """N records, as finish.lua writes them (``history.lua``: per record an HSET field
    prefixed by its batch and an entry in its task's zset, a dead one in ``P|histf``; per
    batch of ``batch`` records a ``P|hist`` and a ``P|histexp`` entry and a ``P|histb``
    field), oldest first, each kept the default 7 days: every ``dead_every``-th dead, and
    the ``rare_every``-th of the oldest tenth of the task :data:`RARE` (0: none)."""
    step = 10_000 // batch * batch
    for start in range(0, n, step):
        pipe = r.pipeline(transaction=False)
        ids = [new_timer_id() for _ in range(min(step, n - start))]
        first = int(r.incrby(ks.sequence, len(ids))) - len(ids)  # batch ids: a run token each
        groups = {f"::{first + k + 1}": ids[k:k + batch] for k in range(0, len(ids), batch)}
        pipe.zadd(ks.history, {b: ended_ms - n + start + k
                               for k, b in enumerate(groups)})
        pipe.zadd(ks.history_expiry, {b: ended_ms - n + start + k + 7 * 86_400_000
                                      for k, b in enumerate(groups)})
        pipe.hset(ks.history_batches, mapping={b: ":".join(g) for b, g in groups.items()})
        values: dict[Any, Any] = {}
        tasks: dict[str, dict[str, int]] = {}
        dead: dict[str, int] = {}
        for k, (b, g) in enumerate(groups.items()):
            end = ended_ms - n + start + k
            for j, i in enumerate(g):
                number = start + k * batch + j
                is_dead = bool(dead_every) and number % dead_every == dead_every // 2
                task = (RARE if rare_every and number < n // 10 and number % rare_every == 7
                        else TASK)
                values[i] = f"{b}|{record_text(end, task, is_dead)}"
                tasks.setdefault(task, {})[i] = end
                if is_dead:
                    dead[i] = end
        pipe.hset(ks.history_records, mapping=values)
        for task, ends in tasks.items():
            pipe.zadd(ks.history_task(task), ends)
        if dead:
            pipe.zadd(ks.history_failed, dead)
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
        r.delete(*HISTORY_KEYS)
        for _ in range(n // BATCH):
            finish_batch(r, calls, *scripts, history=True, keep=keep)
        kept = int(r.hlen(KS.history_records))
        used = sum(int(r.memory_usage(k, samples=0) or 0) for k in HISTORY_KEYS)
        per[label] = used / kept
        print(f"{kept:,} records written by finish.lua in calls of {BATCH}, {label}: "
              f"{per[label]:.1f} bytes a record (the task's zset: "
              f"{int(r.memory_usage(task_zset, samples=0) or 0) / kept:.1f})")
    print(f"a task's own count costs {per['with a count'] - per['without a count']:.1f} "
          "bytes a kept record")


def let_expire(r: redis.Redis, ks: Keyspace = KS) -> None:
    """Every record's expiry now past (a pipeline of ZADDs of ``P|histexp``)."""
    members: list[Any] = list(r.zrange(ks.history_expiry, 0, -1))
    for start in range(0, len(members), 10_000):
        r.zadd(ks.history_expiry, dict.fromkeys(members[start:start + 10_000], 0))


def main_thread_cpu(r: redis.Redis) -> float:
    """Seconds of CPU Redis's main thread has used (``INFO cpu``)."""
    info = r.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def timed_reads(url: str, label: str) -> None:
    """``timers history --failed`` and ``--task`` of the rare task, as the API reads them
    (the command line prints these), median of 3."""
    with Timers(url) as t:
        for what, kwargs in (("--failed", {"failed": True}), (f"--task {RARE}", {"task": RARE})):
            took, found = [], 0
            for _ in range(3):
                began = time.perf_counter()
                found = len(t.history(limit=20, **kwargs))
                took.append(time.perf_counter() - began)
            print(f"{label}: timers history {what}: {statistics.median(took) * 1000:,.1f} ms "
                  f"({found} of 20 found)")


def trim_idle(n: int, count: int, batch: int) -> None:
    """N records to COUNT by one idle listener process: time and SLOWLOG."""
    ks = Keyspace(DEFAULT_PREFIX)
    sha = hashlib.sha1(source("trim").encode()).hexdigest()
    function = f"{script_library()[0]}_trim"
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer() as server:
        (Path(tmp) / "idleapp.py").write_text("import timers\n\n\n@timers.task\n"
                                              "def noop() -> None: ...\n")
        r = redis.Redis.from_url(server.url)
        seconds, micros = r.time()
        now_ms = seconds * 1000 + micros // 1000
        began = time.monotonic()
        fill(r, n, now_ms, batch, ks, dead_every=10_000, rare_every=10_000)
        print(f"server {server.version}; filled {n:,} records (batches of {batch}, "
              f"{r.zcard(ks.history_failed):,} dead, {r.zcard(ks.history_task(RARE)):,} of "
              f"{RARE} among the oldest) in {time.monotonic() - began:.1f} s")
        timed_reads(server.url, f"at {n:,} records, no trim call yet (no index cursor)")
        r.set(ks.history_cursor, now_ms)  # as the first trim calls leave it: all indexed
        timed_reads(server.url, f"at {n:,} records")
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 1_000_000)
        r.slowlog_reset()
        cpu_before = main_thread_cpu(r)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH",
                                                                                "")])}
        listener = subprocess.Popen(
            [sys.executable, "-m", "timers", "listen", "--url", server.url, "--tasks",
             "idleapp", "--history-count", str(count)], cwd=tmp, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.monotonic()
        first = None
        try:
            while (left := int(r.hlen(ks.history_records))) > count:
                if first is None and left < n:
                    first = time.monotonic() - started
                if time.monotonic() - started > 900:
                    raise SystemExit(f"still {left:,} records after 900 s")
                time.sleep(0.25)
            took = time.monotonic() - started
            cpu = main_thread_cpu(r) - cpu_before
        finally:
            listener.terminate()
            listener.wait(30)
        log = r.slowlog_get(1_000_000)
        r.config_set("slowlog-log-slower-than", 10_000)
        calls = sorted(int(e["duration"]) for e in log if e["command"].startswith(
            (f"FCALL {function} ".encode(), f"EVALSHA {sha}".encode())))
        slowest = max(log, key=lambda e: int(e["duration"]))
        print(f"{n:,} -> {count:,} records by an idle listener: {took:.1f} s from its start "
              f"(first record dropped at {first or 0:.1f} s: imports and connections)")
        print(f"its {len(calls):,} trim calls (SLOWLOG, every command logged): median "
              f"{calls[len(calls) // 2]} us, 95th percentile {calls[len(calls) * 95 // 100]} us, "
              f"99th {calls[len(calls) * 99 // 100]} us, slowest {calls[-1]} us; the slowest "
              f"command of any kind meanwhile: {int(slowest['duration'])} us "
              f"({slowest['command'][:40]!r}); Redis's main thread used {cpu:.2f} s of CPU "
              f"in all, {cpu / len(calls) * 1e6:,.0f} us a trim call")
        print(f"left: {r.hlen(ks.history_records):,} records, {r.zcard(ks.history_failed):,} "
              f"dead in the index, {r.zcard(ks.history_task(RARE)):,} of {RARE}")
        timed_reads(server.url, f"at {count:,} records")
        r.close()


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
    p.add_argument("--trim-idle", type=int, metavar="COUNT",
                   help="only: N records trimmed to COUNT by an idle listener (see above)")
    opts = p.parse_args()
    if opts.trim_idle is not None:
        trim_idle(opts.n, opts.trim_idle, opts.batch)
        return
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

        # cleanup: everything past its age, in the listener's trim.lua calls
        trim = r.register_script(source("trim"))

        def trim_call(count: int) -> list[Any]:
            call = calls.trim(count, TRIM_BUDGET)
            return list(trim(keys=list(call.keys), args=list(call.args)))

        let_expire(r)
        before, began, calls_made = redis_usec(r), time.monotonic(), 0
        while trim_call(10**9)[1]:
            calls_made += 1
        spent = redis_usec(r) - before
        print(f"cleanup of {opts.n:,} records past their age: {calls_made:,} trims of about "
              f"{TRIM_BUDGET:,}, {spent / 1e6:.2f} s in Redis ({spent / calls_made / 1000:.2f} "
              f"ms a call, {spent / opts.n:.2f} us a record), {time.monotonic() - began:.1f} s "
              f"wall; {r.hlen(KS.history_records):,} left")
        fill(r, opts.n, now_ms, opts.batch)
        before = redis_usec(r)
        dropped = trim_call(opts.n - TRIM_BUDGET)[0]
        print(f"one count trim of {dropped:,} at {opts.n:,} records: "
              f"{(redis_usec(r) - before) / 1000:.2f} ms in Redis")

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
