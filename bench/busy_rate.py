"""A rate limit on a busy machine, trees alternating in one sitting:
``python -m bench.busy_rate --against REV [--rate 5] [--n 60] [--hogs 12] [--rounds 5]``.

N timers of one task with ``rate="<rate>/s"`` come due at once; one listener process runs
them while ``--hogs`` processes spin on the CPU (a machine busy with other work). Figures,
per run: the time from the first start to the last against the ideal ((N - 1) / rate),
and the runs the listener handed back because they reached their call past their rate
slot's start window. REV's tree (``git archive``) and the working tree take turns, each on a
fresh server, the order turning each round. It writes nothing into the repository.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench.alternate import rev_tree

REPO = Path(__file__).resolve().parent.parent
TASK = '''import os, time
import timers

@timers.task(rate=os.environ["BUSY_RATE"] + "/s")
def go(i: int) -> None:
    with open(os.environ["BUSY_STARTS"], "a") as f:
        f.write(f"{time.time()}\\n")
'''


def _spin() -> None:
    while True:
        pass


def one_run(tree: Path, work: Path, port: int, rate: int, n: int, hogs: int) -> tuple[float, int]:
    """(seconds from the first start to the last, runs handed back) of one run."""
    starts, log = work / "starts.txt", work / "listen.log"
    starts.unlink(missing_ok=True)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "",
                               "--appendonly", "no", "--notify-keyspace-events", "Ex"],
                              stdout=subprocess.DEVNULL)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(hogs)]
    env = dict(os.environ, PYTHONPATH=f"{tree}:{work}", BUSY_RATE=str(rate),
               BUSY_STARTS=str(starts))
    listener = None
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        if server.poll() is not None or client.dbsize():  # another server has the port
            raise RuntimeError(f"port {port}: not a fresh server of this run")
        for spinner in spinners:
            spinner.start()
        with log.open("w") as out:
            listener = subprocess.Popen(
                [sys.executable, "-P", "-m", "timers", "listen", "--url",
                 f"redis://localhost:{port}/0", "--tasks", "busytasks"],
                env=env, cwd=work, stderr=out)
        ready = time.monotonic() + 30
        while "listening:" not in log.read_text():
            if time.monotonic() > ready:
                raise RuntimeError(f"the listener did not start: {log.read_text()[-500:]}")
            time.sleep(0.05)
        code = f"import sys; sys.path.insert(0, {str(tree)!r}); import timers, redis; " \
               f"timers.Timers(redis.Redis(port={port})).schedule_many(" \
               f"[timers.TimerSpec('busy.go', [i], in_=1.0) for i in range({n})])"
        subprocess.run([sys.executable, "-P", "-c", code], check=True)
        deadline = time.monotonic() + 30 + 3 * n / rate
        while time.monotonic() < deadline:
            if starts.exists() and len(starts.read_text().split()) >= n:
                break
            time.sleep(0.1)
        times = [float(t) for t in starts.read_text().split()]
        handed = sum("handed back unstarted" in line for line in log.read_text().splitlines())
        return max(times) - min(times), handed
    finally:
        for spinner in spinners:
            spinner.terminate()
        if listener is not None:
            listener.terminate()
            listener.wait()
        server.terminate()
        server.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True)
    parser.add_argument("--rate", type=int, default=5)
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--hogs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=6397)
    args = parser.parse_args(argv)
    old, label = rev_tree(args.against)
    work = Path(tempfile.mkdtemp(prefix="busy-rate-"))
    (work / "busytasks").mkdir()
    (work / "busytasks" / "__init__.py").write_text("")
    (work / "busytasks" / "busy.py").write_text(TASK)
    sides = {label: old, "tree": REPO}
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
    ideal = (args.n - 1) / args.rate
    print(f"{args.n} due at once through {args.rate}/s, {args.hogs} spinning processes; "
          f"ideal {ideal:.1f} s")
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            took, handed = one_run(sides[name], work, args.port, args.rate, args.n, args.hogs)
            results[name].append((took, handed))
            print(f"round {r + 1} {name}: last start {took:.1f} s after the first "
                  f"({took / ideal:.0%} of ideal), {handed} handed back", flush=True)
    for name, runs in results.items():
        spans = [t for t, _ in runs]
        backs = [h for _, h in runs]
        print(f"{name}: {statistics.median(spans):.1f} s ({min(spans):.1f}-{max(spans):.1f}), "
              f"handed back {statistics.median(backs):.0f} ({min(backs)}-{max(backs)})")


if __name__ == "__main__":
    main()
