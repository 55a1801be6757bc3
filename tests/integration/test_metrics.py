"""Prometheus metrics as a scraper reads them, parsed with prometheus_client's own parser:
a listener's (``listen --metrics-port``, one process and ``--processes 2`` on one port)
after runs with known outcomes, and the keyspace's (``timers metrics``)."""

from __future__ import annotations

import signal
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TIMERS_COMMAND, Processes, runs, started
from tests.task_pkg.slow import RELEASE
from timers import Timers, TimerSpec
from timers.dev.server import EmbeddedServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

TASKS = "tests.task_pkg"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample on ``/metrics``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def answers(port: int) -> Callable[[], bool]:
    def up() -> bool:
        try:
            scrape(port)
        except OSError:
            return False
        return True
    return up


def test_a_listeners_counters_and_histograms_are_exact_after_known_outcomes(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    with Timers(redis_url) as t:
        # a run whose listener dies mid-task: the metrics listener runs it again
        victim = processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks",
                                 TASKS, "--lease", "1")
        t.schedule("slow.block", ["held"], in_=0, id="held")
        wait_until(lambda: started(r) == ["held"], 20, message="the first run to start")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        r.set(RELEASE, 1)
        port = free_port()
        processes.spawn(TIMERS_COMMAND, "listen", "--url", redis_url, "--tasks", TASKS,
                        "--metrics-port", str(port))
        wait_until(answers(port), 20, message="the metrics port to answer")
        t.schedule_many([TimerSpec("record.hit", [f"ok{i}"], in_=0.2) for i in range(20)]
                        + [TimerSpec("fail.boom", [f"bad{i}"], in_=0.2) for i in range(3)])
        wait_until(lambda: len(runs(r)) >= 21 and t.stats().failed >= 3, 20,
                   message="20 runs, the rerun and 3 dead timers")
        r.set("timers:%zz:not a timer", 1, px=50)  # a forged key: rejected when it expires
    samples: Samples = {}

    def counted() -> bool:
        samples.update(scrape(port))
        return (total(samples, "timers_runs_total") >= 24
                and total(samples, "timers_rejected_total") >= 1)
    wait_until(counted, 10, message="the metrics to count every run")
    assert total(samples, "timers_runs_total", task="record.hit", outcome="ok") == 20
    assert total(samples, "timers_runs_total", task="fail.boom", outcome="dead") == 3
    assert total(samples, "timers_runs_total", task="slow.block", outcome="ok") == 1
    assert total(samples, "timers_reruns_total", task="slow.block") == 1
    assert total(samples, "timers_started_total", path="rerun") == 1
    assert total(samples, "timers_lateness_seconds_count") == 24
    assert total(samples, "timers_run_duration_seconds_count", task="record.hit") == 20
    assert total(samples, "timers_lateness_seconds_bucket", le="+Inf") == 24
    assert total(samples, "timers_running") == 0 and total(samples, "timers_free_slots") > 0
    assert total(samples, "timers_rejected_total") == 1


def test_every_child_of_a_supervisor_is_counted_on_one_port(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    port = free_port()
    processes.timers_session("listen", "--url", redis_url, "--tasks", TASKS,
                             "--processes", "2", "--metrics-port", str(port))
    wait_until(answers(port), 20, message="the supervisor's metrics port to answer")
    with Timers(redis_url) as t:
        wait_until(lambda: len(t.listeners()) == 2, 20, message="two children")
        t.schedule_many(TimerSpec("record.hit", [f"m{i}"], in_=0.3) for i in range(200))
    wait_until(lambda: len(runs(r)) >= 200, 20, message="200 runs")
    wait_until(lambda: total(scrape(port), "timers_runs_total", outcome="ok") == 200, 10,
               message="200 runs counted on the one port")


def test_the_keyspace_metrics_show_pending_overdue_dead_and_listeners(
        r: redis.Redis, redis_url: str, processes: Processes) -> None:
    with Timers(redis_url) as t:
        t.schedule_many([TimerSpec("record.hit", [i], in_=30) for i in range(5)]
                        + [TimerSpec("record.hit", [i], in_=1800) for i in range(7)]
                        + [TimerSpec("record.hit", [i], in_=86400, group="video")
                           for i in range(2)])
        t.schedule_many(TimerSpec("record.hit", [i], in_=-5, group="nobody")
                        for i in range(4))  # nobody serves it: overdue
    port = free_port()
    processes.timers("metrics", "--url", redis_url, "--port", str(port))
    wait_until(answers(port), 20, message="timers metrics to answer")
    samples = scrape(port)
    assert total(samples, "timers_pending") == 18
    assert total(samples, "timers_pending", group="video") == 2
    assert total(samples, "timers_overdue", group="nobody") == 4
    assert total(samples, "timers_overdue", group="default") == 0
    assert total(samples, "timers_due_within", window="1m") == 5
    assert total(samples, "timers_due_within", window="1h") == 12
    assert total(samples, "timers_dead") == 0 and total(samples, "timers_listeners") == 0


def test_with_redis_away_a_scrape_says_so_and_the_dashboard_answers_503_then_recovers(
        processes: Processes) -> None:
    server = EmbeddedServer(config=ROOT / "redis.conf").start()
    try:
        metrics_port, web_port = free_port(), free_port()
        processes.timers("metrics", "--url", server.url, "--port", str(metrics_port))
        processes.timers("web", "--url", server.url, "--port", str(web_port))
        web = f"http://127.0.0.1:{web_port}/"
        wait_until(answers(metrics_port), 20, message="timers metrics to answer")
        wait_until(lambda: status(web) == 200, 20, message="timers web to answer")
        server.stop(keep_data=True)
        assert total(scrape(metrics_port), "timers_keyspace_readable") == 0
        assert status(web) == 503
        server.start()
        wait_until(lambda: total(scrape(metrics_port), "timers_keyspace_readable") == 1, 20,
                   message="the scrape to read Redis again")
        wait_until(lambda: status(web) == 200, 20, message="the dashboard to answer again")
    finally:
        server.stop()


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0
