"""Listener child processes (``python -m bench.listener``) and what they report."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import PREFIX, REPO, wait_until

# -- listener processes -----------------------------------------------------------------


@dataclass
class ListenerResult:
    """What a listener child reported: one tuple per run, and its CPU time."""

    fired: list[tuple[int, float, str, bool]]
    cpu_s: float
    """CPU seconds the child used from ready to exit (user + system, all threads)."""
    finished: bool
    """It stopped on its own (got ``expect`` runs), not because it was told to."""
    task_lateness: list[float] = field(default_factory=list)
    """Task's own ``time.time()`` at start minus the due ms in its args (where given)."""
    runs: list[tuple[str, int, float, float]] = field(default_factory=list)
    """Per run: timer id, the due ms its lateness counts from, start and end ms (Redis)."""

    @property
    def lateness_ms(self) -> list[float]:
        return sorted(started - due for due, started, _, _ in self.fired)

    @property
    def sources(self) -> list[str]:
        return [source for _, _, source, _ in self.fired]

    @property
    def failures(self) -> int:
        return sum(1 for *_, ok in self.fired if not ok)


def merge(results: Sequence[ListenerResult]) -> ListenerResult:
    fired = [f for r in results for f in r.fired]
    return ListenerResult(fired, sum(r.cpu_s for r in results), all(r.finished for r in results),
                          [x for r in results for x in r.task_lateness],
                          [x for r in results for x in r.runs])


class ListenerProc:
    """``python -m bench.listener`` in a child process: one Listener with the noop task."""

    def __init__(
        self, url: str, workdir: Path, name: str, *, concurrency: int, expect: int = 0,
        max_seconds: float = 600.0, metrics: bool = False,
    ) -> None:
        self.name = name
        self.out = workdir / f"{name}.json"
        self.ready_file = workdir / f"{name}.ready"
        self.log_path = workdir / f"{name}.log"
        for path in (self.out, self.ready_file):
            path.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "bench.listener", "--url", url, "--prefix", PREFIX,
            "--concurrency", str(concurrency), "--expect", str(expect),
            "--out", str(self.out), "--ready", str(self.ready_file),
            "--max-seconds", str(max_seconds), *(["--metrics"] if metrics else []),
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, seconds: float = 15.0) -> None:
        if not wait_until(lambda: self.ready_file.exists() or not self.alive(), seconds):
            raise RuntimeError(f"listener {self.name} not ready after {seconds:.0f} s"
                               f"{self.log_tail()}")
        if not self.ready_file.exists():
            raise RuntimeError(f"listener {self.name} exited at start{self.log_tail()}")

    def wait_exit(self, seconds: float) -> bool:
        try:
            self.process.wait(timeout=max(seconds, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM (the child stops, drains and writes what it has), then SIGKILL."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            if not self.wait_exit(grace):
                self.process.kill()
                self.process.wait()

    def result(self) -> ListenerResult | None:
        """Stop the child if it still runs and read its report (None if it wrote none)."""
        self.stop()
        try:
            data = json.loads(self.out.read_text())
        except (OSError, ValueError):
            return None
        fired = [(int(d), float(s), str(src), bool(ok)) for d, s, src, ok in data["fired"]]
        runs = [(str(i), int(d), float(s), float(e)) for i, d, s, e in data.get("runs", [])]
        return ListenerResult(fired, float(data["cpu_s"]), bool(data["finished"]),
                              [float(x) for x in data.get("task_lateness", [])], runs)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ("; log:\n    " + "\n    ".join(text)) if text else ""
