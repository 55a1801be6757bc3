"""The workload benchmark's split of a listener's sampled time by who was on the stack."""

from __future__ import annotations

from bench.workload import split_text, who

TASK = "push (bench/listener.py:60)"
LOOP = "run_forever (asyncio/base_events.py:607)"


def test_a_stack_through_the_task_is_the_tasks_even_inside_redis_py() -> None:
    assert who([LOOP, "_work (timers/listener/calling/runner.py:125)", TASK,
                "execute_command (redis/client.py:600)"]) == "the task"


def test_otherwise_the_innermost_of_redis_py_and_timers_owns_it() -> None:
    assert who([LOOP, "flush (timers/listener/endings/writer.py:150)",
                "execute_command (redis/asyncio/client.py:700)",
                "write (asyncio/selector_events.py:1057)"]) == "redis-py"
    assert who([LOOP, "claim (timers/listener/finding/claimer.py:110)"]) == "timers"
    assert who([LOOP, "_run_once (asyncio/base_events.py:1922)"]) == "Python runtime"


def test_the_split_weighs_samples_and_leaves_idle_stacks_out() -> None:
    raw = "\n".join([
        f"thread (1);{LOOP};claim (timers/listener/finding/claimer.py:110) 30",
        f"thread (2);_work (timers/listener/calling/runner.py:125);{TASK} 10",
        f"thread (1);{LOOP};select (selectors.py:468) 500",
        "garbage line",
    ])
    assert split_text(raw) == "timers 75%, the task 25%"
    assert split_text("") == ""
