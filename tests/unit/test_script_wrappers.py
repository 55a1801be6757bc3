"""The Lua prelude is in every script once, and each wrapper sends KEYS and ARGV in the
order its script's header documents (a wrong order would write to the wrong keys)."""

from __future__ import annotations

import importlib
import re
import sys
import types
from importlib import resources
from pathlib import Path

import fakeredis
import pytest

from tests.unit.fresh_imports import fresh_modules
from timers import Timers
from timers.model.keys import SCRIPT_KEY_NAMES, Keyspace
from timers.store.lua_source import PRELUDES, source, without_shebang
from timers.store.script_calls import Invocation, ScriptCalls
from timers.store.script_manifest import (
    SCRIPT_NAMES,
    ScriptName,
    schedule_key_names,
    shared_key_names,
)
from timers.store.script_rows import Departure, GateRun, NewTimer, ParkTimer, Settle
from timers.store.scripts import Scripts

KS = Keyspace("p")
CALLS = ScriptCalls(KS)
ALLOW_OOM = {"renew", "finish", "cancel", "forget", "heartbeat", "reschedule", "cron_pause",
             "cron_remove", "cron_next", "shards", "depart", "trim"}
LABELS = {
    "due index": KS.due, "records": KS.records, "running": KS.running,
    "running records": KS.running_records, "sequence": KS.sequence, "stats": KS.stats,
    "failures": KS.failures, "failure records": KS.failure_records,
    "failure index": KS.failure_index, "listeners": KS.listeners,
    "listener info": KS.listener_info, "task sets": KS.task_sets,
    "recurrence definitions": KS.recurrences,
    "recurrence states": KS.recurrence_states, "layout": KS.shards, "queues": KS.queues,
    "near": KS.near, "history": KS.history, "history records": KS.history_records,
    "history retention": KS.history_retention, "history expiry": KS.history_expiry,
    "history task ages": KS.history_task_ages, "history batches": KS.history_batches,
    "history task counts": KS.history_task_counts, "history dead ends": KS.history_failed,
    "index cursor": KS.history_cursor,
    "series": KS.series,
    "series tasks": KS.series_tasks, "arrivals": KS.arrivals,
    "arrival records": KS.arrival_records, "moves": KS.moves, "walked index": KS.due,
    **{f"{age} {label}": getattr(keys, name)
       for age, keys in (("old", KS), ("new", Keyspace("q")))
       for label, name in (("due index", "due"), ("records", "records"),
                           ("failures", "failures"), ("failure records", "failure_records"),
                           ("failure index", "failure_index"))},
}
SAMPLES: dict[ScriptName, Invocation] = {
    "schedule": CALLS.schedule([NewTimer("a", "t.f:[1]", "in", 5, "r"),
                                NewTimer("b", "t.g:[2]", "at", 7, "n")]),
    "reschedule": CALLS.reschedule("a", "in", 5),
    "cancel": CALLS.cancel("a"),
    "claim": CALLS.claim(limit=3, lease_ms=100, horizon_ms=20, listener_id="me",
                         event_ids=["x", "y"]),
    "renew": CALLS.renew(100, ["1", "2"]),
    "finish": CALLS.finish(retention_ms=9, endings=[("1", "ok", "", "")]),
    "heartbeat": CALLS.heartbeat("me", 30, "{}"),
    "forget": CALLS.forget("a:1", ""),
    "cron_declare": CALLS.cron_declare(
        name_field="n", definition="{}", read_state="", paused="keep", version=2,
        anchor_ms=0, record="t.f;r=n;v=2:null", due_if_withdrawn=100, due_otherwise=200),
    "cron_next": CALLS.cron_next(name_field="n", version=2, due_ms=100, successor_ms=300,
                                 record="t.f;r=n;v=2:null", defer=False, take="", release=""),
    "cron_pause": CALLS.cron_pause("n"),
    "cron_remove": CALLS.cron_remove("n"),
    "gate": CALLS.gate(100, [GateRun("1", "device:7", 1, "", 1, 1)]),
    "park": CALLS.park(100, [ParkTimer("a", "t.f:[1]", "device:7", 1)]),
    "near": CALLS.near(1000),
    "shards": CALLS.shards(16, True),
    "move": CALLS.move(Keyspace("q"), ["t.f"], False, KS.due, 50, ("1000", "a")),
    "arrive": CALLS.settle(100, [Settle("0|7", "c", "a", "t.f;g=v;p=2:[1]")]),
    "depart": CALLS.depart([Departure("7", "v", 1)]),
    "trim": CALLS.trim(100, 250),
}
PER_ITEM_KEYS = {  # the keys each sample names per item ("KEYS[3..] per …")
    "arrive": [KS.due_index("v", 2), KS.timer_key("a:t.f;g=v;p=2:[1]")],
    "depart": [KS.running_of("v")],
}
EXPIRING_KEYS = {  # the expiring keys each sample must name, in order
    "schedule": [KS.timer_key("a:t.f:[1]"), KS.timer_key("b:t.g:[2]")],
    "cron_declare": [KS.timer_key("n@100:t.f;r=n;v=2:null"),
                     KS.timer_key("n@200:t.f;r=n;v=2:null")],
    "cron_next": [KS.timer_key("n@300:t.f;r=n;v=2:null")],
}


def header(name: ScriptName, what: str) -> list[tuple[str, str]]:
    """``(index, label)`` of each ``-- KEYS[n]`` or ``-- ARGV[n]`` line of a script."""
    text = resources.files("timers.store").joinpath("lua", f"{name}.lua").read_text("utf-8")
    found = re.findall(rf"^-- {what}\[([^\]]+)\]\s+(.*)$", text, re.MULTILINE)
    return [(index, label.split(":")[0].strip()) for index, label in found]


def expected_keys(name: ScriptName) -> list[str]:
    out: list[str] = []
    timer_keys = list(EXPIRING_KEYS.get(name, []))
    for index, label in header(name, "KEYS"):
        if "expiring key" in label:  # "KEYS[2+i]": one per timer, the rest of KEYS
            taken = timer_keys if "+i" in index else timer_keys[:1]
            out += taken
            del timer_keys[:len(taken)]
        elif label.startswith("per "):
            out += PER_ITEM_KEYS[name]
        elif label in ("shared keys", "new shared keys"):  # the shared keys its code names
            keyspace = Keyspace("q") if label.startswith("new") else KS
            wanted = (schedule_key_names(replace=True, flow=False) if name == "schedule"
                      else shared_key_names(name))  # (its sample replaces: "r")
            out += [key for key_name, key in zip(SCRIPT_KEY_NAMES, keyspace.script_keys,
                                                 strict=True)
                    if key_name in wanted]
        else:
            out.append(LABELS[label])
    return out


def test_every_script_has_a_sample() -> None:
    assert set(SAMPLES) == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_wrapper_sends_keys_in_the_order_of_its_script_header(name: ScriptName) -> None:
    call = SAMPLES[name]
    assert call.script == name
    assert list(call.keys) == expected_keys(name)


def test_a_schedule_is_given_only_the_shared_keys_its_timers_may_touch() -> None:
    def shared(*timers: NewTimer) -> list[str]:
        return list(CALLS.schedule(timers).keys[2 + len(timers):])

    new = NewTimer("a", "t.f:[1]", "in", 5, "n")
    assert shared(new) == [KS.near]
    assert shared(new, NewTimer("b", "t.f;g=video:[1]", "in", 5, "k")) == [KS.queues, KS.near]
    assert shared(new, NewTimer("c", "t.f;p=3:[1]", "at", 5, "n")) == [KS.queues, KS.near]
    everything = [key for name, key in zip(SCRIPT_KEY_NAMES, KS.script_keys, strict=True)
                  if name in shared_key_names("schedule") and name not in ("due", "rec")]
    assert shared(NewTimer("d", "t.f:[1]", "in", 5, "r"), new) == everything
    assert {"near", "queues"} <= set(shared_key_names("schedule"))


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_wrapper_sends_the_documented_args(name: ScriptName) -> None:
    documented = header(name, "ARGV")
    by_label = {label: int(index) for index, label in documented if index.isdigit()}
    args = SAMPLES[name].args
    if "timer key start \"<prefix>" in by_label:
        assert args[by_label['timer key start "<prefix>'] - 1] == KS.timer_key_start
    if "wake channel" in by_label:
        assert args[by_label["wake channel"] - 1] == KS.wake_channel
    fixed = max(by_label.values())
    variable = any(not index.isdigit() for index, _ in documented)
    assert len(args) >= fixed if variable else len(args) == fixed


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_gets_the_helpers_it_uses_once_right_after_its_shebang(
        name: ScriptName) -> None:
    raw = resources.files("timers.store").joinpath("lua", f"{name}.lua").read_text("utf-8")
    helpers = "".join(resources.files("timers.store").joinpath("lua", f"{f}.lua").read_text("utf-8")
                      for f in PRELUDES)
    defined = re.findall(r"^local function (\w+)", helpers, re.MULTILINE)
    loaded = source(name, declare=True)  # (the declare part kept: it uses helpers too)
    shebang, _, body = raw.partition("\n")
    assert shebang == ("#!lua flags=allow-oom" if name in ALLOW_OOM else "#!lua")
    assert loaded.startswith(shebang + "\n")
    assert loaded.endswith(body)
    included = without_shebang(loaded)[:-len(body)]
    code = re.sub(r"--[^\n]*", "", body + included)
    for helper in defined:
        used = re.search(rf"\b{helper}\(", code)
        count = included.count(f"local function {helper}(")
        assert count == (1 if used else 0), (helper, count)
    assert not without_shebang(loaded).startswith("#!")


def test_scripts_register_each_script_once_and_run(fake: fakeredis.FakeRedis) -> None:
    scripts = Scripts(fake, Keyspace())
    assert scripts.script("cron_next") is scripts.script("cron_next")
    with Timers(fake) as producer:
        producer.schedule("a.b", [1], in_=-1, id="due")
    reply = scripts.claim(limit=5, lease_ms=1000, horizon_ms=0, listener_id="me")
    token = reply[3].decode()
    assert scripts.renew(1000, [token]) == []
    assert scripts.finish(retention_ms=1000, endings=[(token, "ok", "", "")]) == [0]
    assert int(fake.hget(Keyspace().stats, "fired")) == 1


def test_the_recurrence_hook_uses_the_scripts_it_is_given(fake: fakeredis.FakeRedis) -> None:
    from timers.listener.cron_hook import RecurrenceHook

    scripts = Scripts(fake, Keyspace())
    assert RecurrenceHook(fake, Keyspace(), scripts).scripts is scripts


def test_the_cron_package_alone_loads_no_hook_listener_or_asyncio() -> None:
    """What a producer imports for recurrences (``timers`` itself is stubbed out here: its
    own weight is another module's business)."""
    package = Path(__file__).resolve().parents[2] / "timers"
    with fresh_modules("timers", "asyncio"):
        stub = types.ModuleType("timers")
        stub.__path__ = [str(package)]
        sys.modules["timers"] = stub
        cron = importlib.import_module("timers.model.cron")
        cron.recurrence("n", "a.b", cron="0 9 * * *")
        heavy = ("asyncio", "timers.listener.cron_hook", "timers.listener", "timers.runner",
                 "timers.model.runs")
        assert [m for m in heavy if m in sys.modules] == []


@pytest.mark.parametrize("how", ["n", "r", "k"])
@pytest.mark.parametrize("record", ["a.b:[1]", "a.b;g=mail:[1]", "a.b;p=5:", "a.b;m=9:{}"])
def test_a_lone_schedule_call_is_the_call_of_one_timer(how: str, record: str) -> None:
    calls = ScriptCalls(Keyspace("p"))
    for mode, ms in (("in", 60_000), ("at", 1_767_261_600_000)):
        assert calls.schedule_one("id%3A1", record, mode, ms, how) == calls.schedule(
            [NewTimer("id%3A1", record, mode, ms, how)])
