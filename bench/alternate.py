"""Any ``python -m bench`` scenario, old code against new in one sitting:
``python -m bench.alternate --against REV --only flow,fire [--quick] [--rounds N]``.

:mod:`bench.compare` drives each side through a small fixed harness (``bench/side.py``),
which has no flow scenario (a keyed task needs the bench's own tasks package). This tool
runs the full bench of each side instead: REV's whole tree (``git archive`` into
``/tmp/timers-bench-tree-<sha>``, its own ``bench/`` and ``timers/``, imported ahead of the
installed package through ``PYTHONPATH``, with this venv's dependencies) and the working
tree, each ``python -m bench --only NAMES`` in turn, the order turning each round, every
run on its own fresh server. It reads the number cells of each side's table and prints,
per figure, the median and spread (min-max) of each side and new/old, with the load
average before each run. It writes nothing into the repository.

The figures keep the bench's own meaning: "661 ms vs ideal 400 ms (165%)" gives three
numbers, each compared with the same place on the other side; which way is better is the
reader's to say (a duration lower, a rate higher), as in the bench's own table. A number
that is the same in every run (a size, an ideal) is left out.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_NUMBER = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?)")
_LABEL = re.compile(r"([A-Za-z][\w>-]*(?:\s+CPU)?)\s*$")


def rev_tree(rev: str) -> tuple[Path, str]:
    """REV's files (cached under the temp folder) and its short label."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    label = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h", sha],
                           capture_output=True, text=True, check=True).stdout.strip()
    root = Path(tempfile.gettempdir()) / f"timers-bench-tree-{sha[:12]}"
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        (root / ".complete").write_text(sha + "\n")
    return root, label


def figures(table: str) -> dict[str, list[tuple[str, float]]]:
    """Each row of a bench table (``scenario | figure``) -> its result cell's numbers, each
    with the word before it (``p99``, ``max``; empty if none); a note "- scenario: per fire,
    Redis CPU … us and listener CPU … us …" is a row too."""
    rows: dict[str, list[tuple[str, float]]] = {}
    for line in table.splitlines():
        if line.startswith("- ") and ": per " in line:  # a note: "- Fire: …: per fire, …"
            scenario, _, text = line[2:].partition(": per ")
            line = f"| {scenario} | per {text.split(',')[0]} | {text} |"
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not line.startswith("|") or set(cells[0]) <= {"-", " "} \
                or cells[0] == "Scenario":
            continue
        numbers = []
        for match in _NUMBER.finditer(cells[2]):
            before = _LABEL.search(cells[2][:match.start()])
            numbers.append((before.group(1) if before else "",
                            float(match.group(1).replace(",", ""))))
        if numbers:
            rows[f"{cells[0]} | {cells[1]}"] = numbers
    return rows


def _spread(values: Sequence[float]) -> str:
    med = statistics.median(values)
    return f"{med:,.1f} ({min(values):,.1f}-{max(values):,.1f})" if len(values) > 1 \
        else f"{med:,.1f}"


def report(runs: dict[str, list[dict[str, list[tuple[str, float]]]]], old: str,
           new: str) -> list[str]:
    """Markdown lines: per figure and number, each side's median (min-max) and new/old."""
    lines = [f"| figure | {old} | {new} | new/old |", "|---|---|---|---|"]
    for row in runs[new][0] if runs[new] else []:
        for place, (word, _) in enumerate(runs[new][0][row]):
            sides = []
            for side in (old, new):
                values = [r[row][place][1] for r in runs[side]
                          if row in r and len(r[row]) > place]
                sides.append(values)
            if not all(sides) or len(set(sides[0] + sides[1])) == 1:
                continue  # missing, or the same on every run (a size, an ideal)
            ratio = (statistics.median(sides[1]) / statistics.median(sides[0])
                     if statistics.median(sides[0]) else float("nan"))
            scenario, figure = row.split(" | ", 1)
            name = f"{scenario} | {figure.split(' (')[0]} [{word or '#' + str(place + 1)}]"
            lines.append(f"| {name} | {_spread(sides[0])} | {_spread(sides[1])} | "
                         f"{ratio:.2f}x |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.alternate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", required=True, metavar="REV")
    p.add_argument("--only", required=True, metavar="NAMES", help="as python -m bench --only")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keep", metavar="DIR", help="where to keep each run's table and log")
    opts = p.parse_args(argv)
    tree, old = rev_tree(opts.against)
    new = "working tree"
    sides = {old: tree, new: REPO}
    out = Path(opts.keep or tempfile.mkdtemp(prefix="timers-alternate-"))
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, list[tuple[str, float]]]]] = {old: [], new: []}
    loads: list[str] = []
    for round_ in range(opts.rounds):
        order = [old, new] if round_ % 2 == 0 else [new, old]
        for side in order:
            root = sides[side]
            table = out / f"{'old' if side == old else 'new'}-{round_ + 1}.md"
            load = os.getloadavg()[0]
            loads.append(f"round {round_ + 1} {side}: load {load:.2f}")
            print(f"round {round_ + 1}/{opts.rounds}: {side} (load {load:.2f})", flush=True)
            argv_ = [sys.executable, "-m", "bench", "--only", opts.only, "--output", str(table),
                     *(["--quick"] if opts.quick else [])]
            env = dict(os.environ, PYTHONPATH=str(root))
            started = time.monotonic()
            with open(table.with_suffix(".log"), "w") as log:
                done = subprocess.run(argv_, cwd=root, env=env, stdout=log,
                                      stderr=subprocess.STDOUT)
            if done.returncode != 0 or not table.exists():
                print(f"  failed (exit {done.returncode}): see {table.with_suffix('.log')}")
                continue
            runs[side].append(figures(table.read_text()))
            print(f"  {time.monotonic() - started:.0f} s", flush=True)
    print()
    print(f"`python -m bench --only {opts.only}{' --quick' if opts.quick else ''}`, "
          f"{opts.against} against the working tree, {opts.rounds} rounds alternating; "
          f"tables in {out}")
    print()
    print("\n".join(report(runs, old, new)))
    print()
    print("; ".join(loads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
