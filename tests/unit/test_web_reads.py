"""What the dashboard's pending, task and recurrence pages read (fakeredis + lupa, the
scripts claiming and gating as a listener would): every group and priority merged, held-back
timers with them; a task's limits and what waits on them; the runs under way."""

from __future__ import annotations

import re
import time

import fakeredis
import pytest
from starlette.testclient import TestClient

from tests.unit.flow_helpers import KS, LEASE, add, claim, s
from tests.unit.helpers import run_burst
from timers import Timers
from timers.model.history import EndKind, HistoryRecord, MinuteStats
from timers.ops import browse
from timers.ops.tasks import announced_tasks, running_runs, task_flow
from timers.store.script_rows import GateRun
from timers.store.scripts import Scripts
from timers.web.app import create_app
from timers.web.auth import Guard
from timers.web.pages import Dashboard, overview, recurrence_names

__all__ = ["s"]  # the fixture


def test_a_page_merges_every_group_and_priority_soonest_first(
        s: Scripts, producer: Timers) -> None:
    add(s, "a", "t.f:[1]", 30_000)
    add(s, "b", "t.f;g=billing;p=5:[2]", 10_000)
    add(s, "c", "t.f;g=billing:[3]", 20_000)
    add(s, "d", "t.f;p=-3:[4]", 40_000)
    page = producer.run(browse.page(KS, 0, 10))
    assert [t.id for t in page] == ["b", "c", "a", "d"]
    assert [(t.group, t.priority, t.args) for t in page][:2] == [("billing", 5, [2]),
                                                                 ("billing", 0, [3])]
    assert [t.id for t in producer.run(browse.page(KS, 1, 2))] == ["c", "a"]
    assert [t.id for t in producer.run(browse.page(KS, 0, 10, "billing"))] == ["b", "c"]
    assert [t.id for t in producer.run(browse.page(KS, 0, 10, "billing", 5))] == ["b"]
    assert [t.id for t in producer.run(browse.page(KS, 0, 10, None, -3))] == ["d"]
    with pytest.raises(ValueError, match="first 2,500 timers"):
        producer.run(browse.page(KS, browse.MERGE_DEPTH, 1))


def test_held_back_timers_are_on_the_page_saying_what_they_wait_for(
        s: Scripts, producer: Timers) -> None:
    for i in range(3):
        add(s, f"t{i}", "t.f:", -30 + i)
    add(s, "later", "other.g;g=billing:", 60_000)
    runs = claim(s)
    s.gate(LEASE, [GateRun(r.token, "dev:1", 1, "", 1, 1) for r in runs])
    page = producer.run(browse.page(KS, 0, 10))
    assert [t.id for t in page] == ["t1", "t2", "later"]  # t0 runs
    assert [t.wait.describe() if t.wait else None for t in page] == [
        "waiting for key dev:1 (1/1 running)", "waiting for key dev:1 (1/1 running), 1 ahead",
        None]
    assert [t.id for t in producer.run(browse.page(KS, 0, 10, "default"))] == ["t1", "t2"]
    assert [t.id for t in producer.run(browse.filter_task(KS, "t.f", 10))] == ["t1", "t2"]
    assert [t.id for t in producer.run(browse.filter_task(KS, "other.g", 10))] == ["later"]


def test_a_task_wide_key_shows_its_limit_who_runs_and_who_waits(
        s: Scripts, producer: Timers) -> None:
    for i in range(3):
        add(s, f"t{i}", "t.f:", -30 + i)
    runs = claim(s)
    s.gate(LEASE, [GateRun(r.token, "task:t.f", 2, "", 1, 1) for r in runs])
    flow = producer.run(task_flow(KS, "t.f"))
    assert [(x.kind, x.name, x.limit, x.running, x.waiting, x.waiting_here)
            for x in flow.limits] == [("key", "task:t.f", "2 at once", 2, 1, 1)]
    assert sorted(r.run.timer_id for r in flow.running) == ["t0", "t1"]
    other = producer.run(task_flow(KS, "nobody.else"))
    assert other.limits == [] and other.running == []


def test_a_rate_limit_shows_its_interval_and_what_waits_on_it(
        s: Scripts, producer: Timers) -> None:
    for i in range(3):
        add(s, f"t{i}", "t.f:", -30 + i)
    runs = claim(s)
    s.gate(LEASE, [GateRun(r.token, "", 1, "task:t.f", 60_000, 1) for r in runs])
    flow = producer.run(task_flow(KS, "t.f"))
    (rate,) = flow.limits
    assert (rate.kind, rate.name, rate.limit) == ("rate", "task:t.f",
                                                 "1 every 60,000 ms (burst 1)")
    assert rate.waiting_here >= 1 and rate.next_slot_ms is not None


def test_the_runs_under_way_name_their_recurrence(
        s: Scripts, producer: Timers, fake: fakeredis.FakeRedis) -> None:
    fake.hset(KS.listener_info, "me", '{"groups": ["default", "billing"]}')
    add(s, "nightly@1", "t.f;r=nightly%20report:", -10)
    add(s, "plain", "t.f;g=billing:", -10)
    claim(s, groups=("default", "billing"))
    running = producer.run(running_runs(KS))
    assert sorted((r.run.timer_id, r.group) for r in running) == [
        ("nightly@1", "default"), ("plain", "billing")]
    assert recurrence_names(running) == {"nightly report"}


def test_the_announced_tasks_are_read_from_every_task_set(
        fake: fakeredis.FakeRedis, producer: Timers) -> None:
    fake.hset(KS.task_sets, mapping={"aa": "a.x\nb.y", "bb": "b.y\nc.z"})
    assert producer.run(announced_tasks(KS)) == {"a.x", "b.y", "c.z"}


def test_the_overview_never_shows_a_negative_rate_after_a_redis_restart(
        fake: fakeredis.FakeRedis, producer: Timers) -> None:
    producer.warn_in_event_loop = False
    d = Dashboard(producer, spacing_s=0)
    fake.hset(KS.stats, mapping={"fired": 1000, "failed": 10, "retried": 5})
    assert overview(d)["rates"] is None  # one sample: no rate yet
    fake.hset(KS.stats, mapping={"fired": 1003, "failed": 10, "retried": 5})
    assert overview(d)["rates"] == (3, 0)
    fake.delete(KS.stats)  # Redis restarted without its data ...
    fake.hset(KS.stats, mapping={"fired": 2})  # ... and two runs ended since
    rates = overview(d)["rates"]
    assert rates == (5, 0)
    hour = overview(d)["charts"][0][1]
    assert "-" not in "".join(re.findall(r'text-anchor="end">([^<]+)<', str(hour)))


class WithHistory(Timers):
    """A client whose run history holds two ended runs and a busy series, and that notes
    what the pages asked of it."""

    asked: list[tuple[object, ...]]

    def history(self, task: str | None = None, since: float | None = None,
                failed: bool = False, limit: int = 100) -> list[HistoryRecord]:
        self.asked.append(("history", task, failed, limit))
        now = time.time()
        rows = [HistoryRecord("sms-1", "reminders.sms", EndKind.COMPLETED, now - 30,
                              "web-1:41:a", 12, 1, 3),
                HistoryRecord("<b>x</b>", "reminders.sms", EndKind.DEAD, now - 60, "web-2:42:b",
                              80, 3, 9, "SMSError: <i>gateway down</i>")]
        return [r for r in rows if r.failed or not failed][:limit]

    def series(self, task: str | None = None, minutes: int = 60) -> list[MinuteStats]:
        self.asked.append(("series", task, minutes))
        first = (int(time.time()) // 60 - minutes + 1) * 60  # (read when asked, as the API)
        return [MinuteStats(first + 60 * i, 10 + i % 3, i % 2, 4.0, 40.0 + i, 10.0, 90.0)
                for i in range(minutes)]


def test_with_run_history_the_pages_show_it_and_chart_it(fake: fakeredis.FakeRedis) -> None:
    t = WithHistory(fake)
    with t:
        t.warn_in_event_loop = False
        t.asked = []
        t.schedule("reminders.sms", [1], in_=600)
        c = TestClient(create_app(t, Guard()), base_url="http://127.0.0.1:8080")
        page = c.get("/history").text
        assert "sms-1" in page and "completed" in page and "web-2:42" in page
        assert '<td class="bad">dead</td>' in page
        assert "&lt;i&gt;gateway down&lt;/i&gt;" in page and "<b>x</b>" not in page
        failed = c.get("/history?failed=1&task=reminders.sms").text
        assert "sms-1" not in failed and "SMSError" in failed
        assert ("history", "reminders.sms", True, 100) in t.asked
        overview = c.get("/").text
        assert "From the run history." in overview
        # a bar every minute of the hour, every 15 minutes of the day (one less if a minute
        # began between the page's read of the time and the series')
        assert overview.count('class="bar series-runs"') >= 59 + 95
        task = c.get("/task?name=reminders.sms").text
        assert 'id="task-chart-lateness"' in task and 'id="task-runs"' in task
        assert ("series", "reminders.sms", 1440) in t.asked


def test_a_task_known_only_by_its_runs_has_its_page(
        server: fakeredis.FakeServer, producer: Timers) -> None:
    """No listener announces ``mod.add`` any more (the one that ran it has stopped) and no
    timer of it waits: its runs alone make it a task with a page; a name with nothing at
    all is not found."""
    producer.schedule("mod.add", [1], in_=0, id="ran-once")
    run_burst(server)
    c = TestClient(create_app(producer, Guard()), base_url="http://127.0.0.1:8080")
    page = c.get("/task?name=mod.add")
    assert page.status_code == 200 and "ran-once" in page.text
    assert c.get("/task?name=mod.nothing").status_code == 404
