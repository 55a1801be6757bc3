"""What each Lua script of ``timers/store/lua`` links and is given, declared once.

A script as sent to Redis is its file with the shared helpers it uses linked in before its
body (the top-level locals of the helper files ``lua/prelude.lua``, ``lua/flow.lua``,
``lua/history.lua`` and ``lua/declare.lua``), and a call of it is given the shared keys its
code may touch as the last of its KEYS. Both are written down here, not read from the Lua:

- :data:`SCRIPTS`, for each script: the helpers its own code names (``helpers``); the
  shared keys, of :data:`~timers.model.keys.SCRIPT_KEY_NAMES`, that it or a helper it links
  builds with ``sys_key`` (``keys``); the helpers its declare part names besides
  (``declare``, linked only where scripts ask for their keys: ``lua/declare.lua``);
- :data:`HELPER_CALLS`, for each helper that names others: those it names.

A script links the helpers it names and, in turn, those they name (:func:`linked_helpers`),
only those: Redis runs every top-level ``local function`` of a script on each call, and
each makes a closure (figures: bench/FINDINGS.md, "Shared Lua helpers"). A call is given
only the keys listed: each key more in KEYS costs Redis time on every call (figures:
bench/FINDINGS.md, "Keys a script is given"). :mod:`timers.store.lua_source` links by this
manifest and :class:`timers.store.script_calls.ScriptCalls` gives the keys by it;
``tests/unit/test_script_manifest.py`` reads the Lua and fails, naming the script or helper,
on a name used and not declared here or declared and not used.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Literal, NamedTuple

from timers.model.keys import SCRIPT_KEY_NAMES

ScriptName = Literal[
    "schedule", "reschedule", "cancel", "claim", "renew", "finish", "heartbeat", "forget",
    "cron_declare", "cron_next", "cron_pause", "cron_remove", "gate", "park",
    "near", "shards", "move", "arrive", "depart", "trim",
]


class Links(NamedTuple):
    """One script's entry in :data:`SCRIPTS`, each a space-separated list of names."""

    helpers: str
    """The shared helpers its code names (it links them and those they name)."""
    keys: str
    """The shared keys it may touch, in its code or a helper it links (not its declare
    part's: that part asks for the keys it needs as it runs)."""
    declare: str = ""
    """The helpers its declare part names that its code does not."""


EVERY_KEY = " ".join(SCRIPT_KEY_NAMES)
"""Every shared key (those of most scripts that change a timer's state)."""

SCRIPTS: dict[ScriptName, Links] = {
    "schedule": Links(
        helpers="redis_now due_key_for wake pend pend_batch pend_flush unpark",
        keys=EVERY_KEY,
        declare="need keys_asked need_timer need_unpark"),
    "reschedule": Links(
        helpers="redis_now is_int wake withdraw pend unpark without_waited_from",
        keys=EVERY_KEY,
        declare="keys_asked need_timer need_withdraw"),
    "cancel": Links(
        helpers="redis_now wake withdraw unpark history_add history_task_key history_task_trim",
        keys=EVERY_KEY,
        declare="need keys_asked need_withdraw"),
    "claim": Links(
        helpers="redis_now new_tokens is_count head_due record_option record_group "
                "record_priority sys_key due_key_for served_due_indexes running_key_for run_read "
                "record_task note_ungated record_reruns transfer_slot release_slot",
        keys=EVERY_KEY,
        declare="flow_key barrier_of DECLARE_SLACK_MS DECLARE_WINDOW is_declared need keys_asked "
                "need_taken_back need_release"),
    "renew": Links(
        helpers="redis_now is_count DEFAULT_GROUP record_group sys_key flow_key running_key_for "
                "run_read",
        keys="held",
        declare="need keys_asked need_run"),
    "finish": Links(
        helpers="redis_now new_tokens is_count each_thousand DEFAULT_GROUP record_group sys_key "
                "running_key_for run_read wake pend barrier_of taker note_ungated drop_ungated "
                "with_waited_from with_reruns record_reruns take_back_next release_slot "
                "promote_barred keep_slot_for unpark series_text_ok history_batch history_index "
                "history_task_key history_text_task history_task_trim series_add",
        keys=EVERY_KEY,
        declare="flow_key need keys_asked need_timer need_run need_barred need_unpark "
                "need_release"),
    "heartbeat": Links(helpers="redis_now is_count", keys=""),
    "forget": Links(helpers="", keys=""),
    "cron_declare": Links(
        helpers="redis_now not_ints wake withdraw pend state_read state_write occurrence unpark",
        keys=EVERY_KEY,
        declare="keys_asked need_timer need_withdraw"),
    "cron_next": Links(
        helpers="redis_now not_ints wake pend state_read state_write occurrence",
        keys="queues near",
        declare="due_key_for need keys_asked need_timer"),
    "cron_pause": Links(
        helpers="wake withdraw state_read state_write occurrence unpark",
        keys=EVERY_KEY,
        declare="keys_asked need_withdraw"),
    "cron_remove": Links(
        helpers="wake withdraw state_read occurrence unpark",
        keys=EVERY_KEY,
        declare="keys_asked need_withdraw"),
    "gate": Links(
        helpers="redis_now is_count record_option record_group sys_key flow_key running_key_for "
                "run_read wake pend barrier_of ms_text flow_score note_ungated drop_ungated "
                "parked_read barred parked_write with_waited_from with_reruns take_back_next "
                "free_lapsed_slots promote_key server_started_by rate_tat rate_keep promote_rate "
                "release_slot promote_barred",
        keys=EVERY_KEY,
        declare="need keys_asked need_timer need_barrier need_promoted need_key need_rate "
                "need_barred need_taken_back need_release"),
    "park": Links(
        helpers="redis_now is_count record_option sys_key flow_key due_key_for served_due_indexes "
                "wake FLOW_DUE_SPAN record_task barrier_of flow_score drop_ungated barred "
                "parked_write with_waited_from promote_key",
        keys=EVERY_KEY,
        declare="need keys_asked need_timer need_barrier need_promoted need_key"),
    "near": Links(
        helpers="redis_now is_count sys_key near_horizon set_near_key",
        keys="queues near",
        declare="need keys_asked"),
    "shards": Links(helpers="", keys=""),
    "move": Links(
        helpers="redis_now is_count sys_key wake withdraw pend record_task",
        keys="queues parked near",
        declare="keys_asked need_timer"),
    "arrive": Links(
        helpers="redis_now is_int is_count sys_key wake pend unpark",
        keys=EVERY_KEY,
        declare="need keys_asked need_timer need_unpark"),
    "depart": Links(
        helpers="redis_now is_count sys_key run_read drop_ungated promote_barred",
        keys=EVERY_KEY,
        declare="flow_key barrier_of need keys_asked need_barred"),
    "trim": Links(
        helpers="redis_now is_count history_plan history_upkeep",
        keys="",
        declare="history_task_key need keys_asked"),
}
"""Each script, in the order the function library holds them."""

SCRIPT_NAMES: tuple[ScriptName, ...] = tuple(SCRIPTS)

HELPER_CALLS: dict[str, str] = {
    # prelude.lua
    "not_ints": "is_int",
    "record_group": "DEFAULT_GROUP record_option",
    "record_priority": "record_option",
    "due_key_for": "DEFAULT_GROUP record_group record_priority",
    "served_due_indexes": "DEFAULT_GROUP sys_key",
    "running_key_for": "DEFAULT_GROUP",
    "note_head": "head_due index_heads wake_due",
    "wake": "wake_due",
    "withdraw": "due_key_for",
    "near_horizon": "is_count sys_key NEAR_HORIZON_MS near_horizon_ms",
    "set_near_key": "near_horizon_ms near_horizon",
    "pend": "sys_key due_key_for note_head set_near_key",
    "pend_flush": "each_thousand",
    # flow.lua
    "barrier_of": "record_option record_task",
    "flow_score": "record_priority FLOW_DUE_SPAN",
    "note_ungated": "sys_key flow_key barrier_of flow_score",
    "drop_ungated": "sys_key flow_key barrier_of",
    "barred": "record_group sys_key flow_key due_key_for running_key_for run_read FLOW_DUE_SPAN "
              "barrier_of parked_read",
    "parked_write": "sys_key ms_text",
    "with_waited_from": "record_option ms_text",
    "record_reruns": "is_count record_option",
    "due_part": "record_option",
    "pop_waiting": "sys_key parked_read",
    "hand_next": "redis_now record_option record_group sys_key flow_key ms_text taker flow_score "
                 "parked_read barred due_part",
    "take_back_next": "record_option record_group sys_key flow_key running_key_for run_read "
                      "flow_score parked_write with_waited_from with_reruns",
    "free_lapsed_slots": "sys_key",
    "transfer_slot": "sys_key flow_key take_back_next",
    "promote_key": "record_option record_group sys_key flow_key pend ms_text taker barred "
                   "parked_write due_part pop_waiting hand_next free_lapsed_slots",
    "server_started_by": "started_by",
    "rate_tat": "server_started_by",
    "rate_keep": "ms_text",
    "promote_rate": "sys_key flow_key pend ms_text parked_write pop_waiting rate_tat",
    "pass_slot": "record_option record_group sys_key flow_key running_key_for run_read taker "
                 "hand_next",
    "release_slot": "sys_key flow_key promote_key pass_slot",
    "promote_barred": "sys_key promote_key",
    "keep_slot_for": "sys_key flow_key ms_text parked_write take_back_next",
    "unpark": "redis_now sys_key flow_key parked_read promote_key rate_keep promote_rate "
              "promote_barred",
    # history.lua
    "history_add": "history_batch history_index",
    "history_record_task": "history_value_fields",
    "history_lives": "history_value_fields",
    "history_reindex": "each_thousand history_failed_key history_task_key history_value_fields",
    "history_taken_tasks": "history_record_task",
    "history_drop": "each_thousand history_failed_key history_reindex",
    "history_plan": "history_lives history_taken_tasks",
    "history_upkeep": "history_reindex history_drop",
    "history_task_trim": "each_thousand history_record_task",
    "series_add": "SERIES_SLOTS histogram_read histogram_text",
    # declare.lua
    "is_declared": "declared_keys",
    "need": "asked_list asked_set is_declared",
    "keys_asked": "asked_list",
    "need_timer": "sys_key due_key_for need",
    "need_run": "record_group sys_key running_key_for run_read need",
    "need_barrier": "sys_key flow_key due_key_for barrier_of need need_run",
    "need_promoted": "record_group sys_key running_key_for need need_timer need_barrier",
    "need_heads": "sys_key parked_read need need_promoted",
    "need_key": "flow_key need need_heads",
    "need_rate": "flow_key need need_heads",
    "need_barred": "sys_key need need_key",
    "need_unpark": "sys_key flow_key parked_read need need_key need_rate need_barred",
    "need_withdraw": "need_timer need_unpark",
    "need_taken_back": "record_group sys_key running_key_for run_read with_waited_from "
                       "with_reruns need need_promoted",
    "need_release": "sys_key need need_key need_taken_back",
}
"""Each helper that names others (a function it calls, a constant it reads): those names.
Helpers of one file come in its order."""

SCHEDULE_NEW_KEYS = ("near",)
"""The shared keys ``schedule.lua`` touches for new timers (``pend``: the near horizon)."""
SCHEDULE_FLOW_KEYS = ("queues",)
"""… and for a timer with a group or priority (``pend`` lists its due index)."""


def with_callees(names: Iterable[str]) -> frozenset[str]:
    """``names`` and every helper they name, directly or through another
    (:data:`HELPER_CALLS`)."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += HELPER_CALLS.get(name, "").split()
    return frozenset(found)


@cache
def linked_helpers(name: ScriptName, declare: bool = False) -> frozenset[str]:
    """The names of the helpers script ``name`` links: those its code names and those they
    name, with its declare part's when ``declare``."""
    links = SCRIPTS[name]
    return with_callees((links.helpers + " " + links.declare if declare
                         else links.helpers).split())


@cache
def shared_key_names(name: ScriptName) -> tuple[str, ...]:
    """The names (of :data:`~timers.model.keys.SCRIPT_KEY_NAMES`, in its order) of the
    shared keys a call of script ``name`` is given as the last of its KEYS."""
    wanted = SCRIPTS[name].keys.split()
    return tuple(n for n in SCRIPT_KEY_NAMES if n in wanted)


@cache
def schedule_key_names(replace: bool, flow: bool) -> tuple[str, ...]:
    """The names (as :func:`shared_key_names`) of the shared keys a ``schedule.lua`` call
    is given: every one its code names when a timer may replace a pending one
    (``replace``: mode "r", whose ``unpark`` may pass a held slot on), else the near
    horizon's, and the queues set's when a timer may have a group or priority (``flow``).
    The due index and the records are its first KEYS already. Each key more costs Redis
    work on every call (figures: bench/FINDINGS.md, "Keys a script is given")."""
    if replace:
        wanted = set(shared_key_names("schedule")) - {"due", "rec"}
    else:
        wanted = {*SCHEDULE_NEW_KEYS, *(SCHEDULE_FLOW_KEYS if flow else ())}
    return tuple(n for n in SCRIPT_KEY_NAMES if n in wanted)
