"""The scrape targets and the dashboard as an operator starts them: a scrape while Redis is
paused (SIGSTOP) answers within 2 s and says Redis is unreadable; ``timers metrics`` starts
while Redis is down and says where it serves; ``listen --metrics-port`` says where it
serves; a busy port is one ``error:`` line and exit 1 for each of them."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, wait_until
from tests.integration.helpers import TASKS, Processes, run_cli
from timers import Timers
from timers.dev.server import EmbeddedServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_server]

Samples = dict[str, float]


def scrape(url: str, timeout: float = 10) -> Samples:
    """``/metrics`` at ``url`` (unlabelled sums by name)."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[s.name] = found.get(s.name, 0) + s.value
    return found


def answers(url: str) -> bool:
    try:
        scrape(url, timeout=5)
    except OSError:
        return False
    return True


def test_a_scrape_answers_within_2_s_while_redis_is_paused_and_says_it_is_unreadable(
        own_server: EmbeddedServer, processes: Processes) -> None:
    with Timers(own_server.url) as t:
        t.schedule("record.hit", [1], in_=600)
    metrics_port, web_port = free_port(), free_port()
    processes.timers("metrics", "--url", own_server.url, "--port", str(metrics_port))
    processes.timers("web", "--url", own_server.url, "--port", str(web_port))
    targets = [f"http://127.0.0.1:{metrics_port}/metrics",
               f"http://127.0.0.1:{web_port}/metrics"]
    for url in targets:
        wait_until(lambda url=url: answers(url), 20, message=f"{url} to answer")
        assert scrape(url)["timers_pending"] == 1  # (both made their connections)
    assert own_server.pid is not None
    os.kill(own_server.pid, signal.SIGSTOP)
    for url in targets:
        for _ in range(2):  # a new connection, then the one the first scrape left
            started = time.monotonic()
            samples = scrape(url)
            took = time.monotonic() - started
            print(f"\n{url} while Redis is paused: {took:.2f} s")
            assert took < 2.0, f"the scrape took {took:.1f} s"
            assert samples == {"timers_keyspace_readable": 0}, "no stale figures"
    os.kill(own_server.pid, signal.SIGCONT)
    for url in targets:
        wait_until(lambda url=url: scrape(url).get("timers_keyspace_readable") == 1, 20,
                   message="the scrape to read Redis again")
        assert scrape(url)["timers_pending"] == 1


def test_timers_metrics_starts_while_redis_is_down_and_says_where_it_serves(
        processes: Processes) -> None:
    redis_port, metrics_port = free_port(), free_port()
    server = EmbeddedServer(config=ROOT / "redis.conf", port=redis_port)
    proc = processes.timers("metrics", "--url", server.url, "--port", str(metrics_port))
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    wait_until(lambda: answers(url), 20, message="timers metrics to answer, Redis down")
    assert scrape(url) == {"timers_keyspace_readable": 0}
    said = wait_until(lambda: "until it does" in processes.output(proc)
                      and processes.output(proc), 10, message="the warning")
    assert f"at {url} (Ctrl-C stops)" in said
    assert re.search(r"warning: Redis does not answer yet \(.*\): scrapes report "
                     r"timers_keyspace_readable 0 until it does", said)
    server.start()
    try:
        wait_until(lambda: scrape(url).get("timers_keyspace_readable") == 1, 20,
                   message="the scrape to read Redis once it runs")
        assert proc.poll() is None
    finally:
        server.stop()


def test_listen_says_where_it_serves_its_metrics(redis_url: str,
                                                 processes: Processes) -> None:
    port = free_port()
    proc = processes.timers("listen", "--url", redis_url, "--tasks", TASKS,
                            "--metrics-port", str(port))
    url = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: answers(url), 20, message="the metrics port to answer")
    wait_until(lambda: f"serving metrics at {url}" in processes.output(proc), 10,
               message="the listener to log where it serves")


@pytest.mark.parametrize("command", ["web", "metrics", "listen"])
def test_a_busy_port_is_one_error_line_and_exit_1(redis_url: str, command: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        args = {"web": ["web", "--port", port], "metrics": ["metrics", "--port", port],
                "listen": ["listen", "--tasks", TASKS, "--metrics-port", port]}[command]
        done = run_cli(*args, "--url", redis_url)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], "one line"
    assert re.fullmatch(rf"error: cannot serve (metrics )?on 127\.0\.0\.1:{port}: "
                        r"Address already in use\n", done.stderr), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "http://" not in done.stdout, "no URL printed for a port it does not serve"


def test_a_bad_allow_host_is_one_error_line_and_exit_1(redis_url: str) -> None:
    done = run_cli("web", "--url", redis_url, "--allow-host", "dash.example.com:8080")
    assert (done.returncode, done.stderr) == (1, "error: not a name to answer to: "
                                              "'dash.example.com:8080' is not a host name "
                                              "(give it without a port, e.g. "
                                              "dashboard.example.com)\n")


@pytest.mark.parametrize("allowed", ["*", "dash.example.com"])
def test_allow_host_star_says_at_start_that_the_host_check_is_off(
        redis_url: str, processes: Processes, allowed: str) -> None:
    port = free_port()
    proc = processes.timers("web", "--url", redis_url, "--port", str(port),
                            "--allow-host", allowed)
    url = f"http://127.0.0.1:{port}/"
    said = wait_until(lambda: "Ctrl-C stops" in processes.output(proc)
                      and processes.output(proc), 20, message="timers web to start")
    warned = [line for line in said.splitlines() if "Host check" in line]
    foreign = urllib.request.Request(url, headers={"Host": "evil.example"})
    try:
        with urllib.request.urlopen(foreign, timeout=10) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    if allowed == "*":  # the check is off indeed, and the one line says so
        assert status == 200
        assert warned == ["warning: --allow-host '*' turns the Host check off: a page on "
                          "any site can read the dashboard through DNS rebinding (name the "
                          "hosts instead)"]
    else:
        assert (status, warned) == (400, [])
