"""The shipped Grafana dashboard and Prometheus rules (docs/deploy/) read only what the
exporters expose: every metric they name is in a live scrape of a real listener
(``timers listen --metrics-port``) and of the keyspace (``timers metrics``), after runs of
every outcome, and every label they group or match by is one of those metrics' labels; the
dashboard's queries and the rules parse in ``promtool`` (when installed)."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import poll, wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes, runs
from tests.promql import RULES, dashboard_exprs, names, rule_exprs
from timers import Timers, TimerSpec
from timers.dev.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]
ADDED_BY_PROMETHEUS = {"instance", "job"}


def exposed(*ports: int) -> dict[str, set[str]]:
    """Every sample name on the ports' ``/metrics`` -> its label names."""
    found: dict[str, set[str]] = {}
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found.setdefault(sample.name, set()).update(sample.labels)
    return found


def test_every_name_the_dashboard_and_rules_read_is_in_a_live_scrape(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    listener_port, keyspace_port = free_port(), free_port()
    processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", "tests.task_pkg",
                    "--metrics-port", str(listener_port))
    processes.timers("metrics", "--url", redis_url, "--port", str(keyspace_port))
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 1, 20, message="the listener to start")
        t.schedule_many([TimerSpec("record.hit", ["ok"], in_=0.1),
                         TimerSpec("fail.boom", ["bad"], in_=0.1),
                         TimerSpec("record.hit", ["later"], in_=600, group="video")])
        wait_until(lambda: len(runs(r)) >= 1 and t.stats().failed >= 1, 20,
                   message="a run and a dead timer")
    exprs = dashboard_exprs() + rule_exprs()
    read = [names(e) for e in exprs]
    wanted = set().union(*(m for m, _ in read))
    scraped: dict[str, set[str]] = {}

    def complete() -> bool:
        scraped.clear()
        scraped.update(exposed(listener_port, keyspace_port))
        return wanted <= scraped.keys()
    poll(complete, 10, 0.1)  # (the listener flushes its counts every second)
    assert wanted <= scraped.keys(), f"not exposed: {sorted(wanted - scraped.keys())}"
    for expr, (metrics, labels) in zip(exprs, read, strict=True):
        known = set().union(*(scraped[m] for m in metrics)) | ADDED_BY_PROMETHEUS
        assert labels <= known, f"{expr!r} reads labels {sorted(labels - known)}"


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian: apt-get install prometheus)")
def test_the_rules_and_the_dashboards_queries_pass_promtool(tmp_path: Path) -> None:
    promtool = str(shutil.which("promtool"))
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    as_rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$__rate_interval", "5m")}
        for i, e in enumerate(dashboard_exprs())]}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(as_rules))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yml")],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
