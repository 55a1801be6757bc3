"""The same-sitting comparison's arithmetic: spreads, ratios, the threshold, the table."""

from __future__ import annotations

from pathlib import Path

from bench import compare
from bench.compare import (
    BEGIN,
    END,
    INSIDE,
    IOREDIS_ALONE,
    REDIS_PY_ALONE,
    WORKING_TREE,
    Figure,
    Run,
    Spread,
    fails,
    life_notes,
    markdown,
    own_cpu_notes,
    ratio,
    script_notes,
    splice,
    table_lines,
)

RATE = Figure("single", "single calls, /s", "rate")
FIRST = Figure("fire_sync", "  first start, ms", "first_ms", higher_is_better=False)
CPU = Figure("single", "  CPU per call, us", "client_cpu_us", False, gated=False)


def run(round_: int, side: str, **figures: float) -> Run:
    scenario = "fire_sync" if "first_ms" in figures else "single"
    return Run(round_, scenario, side, figures, load1=1.0, ping_us=80.0, at="12:00:00")


def test_a_spread_is_the_median_and_the_extremes() -> None:
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert spread == Spread(2.5, 1.0, 10.0, 4)
    assert Spread.of([]) is None
    assert Spread(2_500.0, 2_000.0, 3_000.0, 3).text() == "2,500 (2,000-3,000)"
    assert Spread(27.5, 27.5, 27.5, 1).text() == "27.5"


def test_the_ratio_is_of_the_medians_subject_over_other() -> None:
    assert ratio(Spread(75.0, 70, 80, 3), Spread(100.0, 90, 110, 3)) == 0.75
    assert ratio(None, Spread(1.0, 1, 1, 1)) is None
    assert ratio(Spread(1.0, 1, 1, 1), Spread(0.0, 0, 0, 1)) is None


def test_the_threshold_reads_each_figure_in_its_own_direction() -> None:
    assert fails(RATE, 0.96, 0.97) and not fails(RATE, 0.97, 0.97)
    assert fails(FIRST, 1.04, 0.97) and not fails(FIRST, 0.5, 0.97)
    assert not fails(CPU, 5.0, 0.97)  # shown, not gated
    assert not fails(RATE, 0.1, None) and not fails(RATE, None, 0.97)


def test_table_lines_gate_only_against_the_revision() -> None:
    runs = [run(1, "old", rate=100.0, client_cpu_us=50.0), run(1, WORKING_TREE, rate=80.0,
                                                                client_cpu_us=60.0),
            run(2, "old", rate=120.0), run(2, WORKING_TREE, rate=90.0),
            run(1, "huey", rate=50.0),
            run(1, "old", first_ms=10.0), run(1, WORKING_TREE, first_ms=9.0)]
    runs.append(Run(3, "single", "old", {}, 1.0, 80.0, "12:00:00", error="exit 1"))
    sides = ["old", WORKING_TREE, "huey"]
    lines = table_lines(runs, sides, WORKING_TREE, "old", 0.97, [RATE, CPU, FIRST])
    rate, cpu, first = lines
    assert rate.cells["old"] == Spread(110.0, 100.0, 120.0, 2)
    assert rate.ratios == {"old": 85.0 / 110.0, "huey": 85.0 / 50.0}
    assert rate.failed and not cpu.failed and not first.failed
    assert first.cells["huey"] is None and first.ratios["huey"] is None
    text = markdown(lines, sides, WORKING_TREE)
    assert "| single calls, /s **(below threshold)** | 110 (100-120) | 85.0 (80.0-90.0) |" in text
    assert "0.77x" in text and "1.70x" in text
    assert "- first start, ms" in text


def test_nothing_measured_makes_no_line() -> None:
    assert table_lines([], ["old", WORKING_TREE], WORKING_TREE, "old", 0.97, [RATE]) == []


def test_splice_replaces_only_its_own_section() -> None:
    document = "# results\n\nfull run\n"
    once = splice(document, "## Same sitting\n\ntable 1")
    assert once.startswith(document) and BEGIN in once and "table 1" in once
    twice = splice(once + "\nmore after\n", "## Same sitting\n\ntable 2")
    assert "table 1" not in twice and "table 2" in twice
    assert twice.count(BEGIN) == 1 and twice.count(END) == 1
    assert twice.startswith(document) and twice.endswith("more after\n")
    assert splice("", "x").startswith(BEGIN)


def test_each_worker_own_cpu_is_its_median_less_its_task_alone() -> None:
    def fire(round_: int, side: str, cpu: float) -> Run:
        return Run(round_, "fire_async", side, {"rate": 1.0, "worker_cpu_us": cpu},
                   load1=1.0, ping_us=80.0, at="12:00:00")

    runs = [fire(1, WORKING_TREE, 200.0), fire(2, WORKING_TREE, 260.0),
            fire(3, WORKING_TREE, 220.0), fire(1, REDIS_PY_ALONE, 100.0),
            fire(2, REDIS_PY_ALONE, 140.0), fire(1, "bullmq", 180.0),
            fire(1, IOREDIS_ALONE, 30.0)]
    assert own_cpu_notes(runs) == [
        "fire_async: working tree 100 us of its own per fire (220 us in all, its task alone "
        "120 us); bullmq 150 us of its own per fire (180 us in all, its task alone 30.0 us)"]
    # a side without its floor (or the floor without its side) says nothing
    assert own_cpu_notes([r for r in runs if r.side != IOREDIS_ALONE]) == [
        "fire_async: working tree 100 us of its own per fire (220 us in all, its task alone "
        "120 us)"]
    assert own_cpu_notes([r for r in runs if r.side not in (REDIS_PY_ALONE, "bullmq")]) == []


def test_a_life_is_one_schedule_and_one_fire_on_the_server() -> None:
    def one(round_: int, scenario: str, side: str, cpu: float) -> Run:
        return Run(round_, scenario, side, {"rate": 1.0, "server_cpu_us": cpu},
                   load1=1.0, ping_us=80.0, at="12:00:00")

    runs = [one(1, "single", WORKING_TREE, 50.0), one(2, "single", WORKING_TREE, 70.0),
            one(3, "single", WORKING_TREE, 60.0), one(1, "fire_async", WORKING_TREE, 30.0),
            one(1, "single", "bullmq", 70.0), one(1, "fire_async", "bullmq", 80.0),
            one(1, "single", "huey", 40.0)]
    assert life_notes(runs) == [
        "Redis CPU per life, single + fire_async: bullmq 150 us (70.0 + 80.0); "
        "working tree 90.0 us (60.0 + 30.0)"]  # (huey fired nothing async: no life)


def test_a_breakdown_counts_a_script_once_and_its_commands_inside_it() -> None:
    logged = Run(0, "single", WORKING_TREE, {"rate": 1.0}, load1=1.0, ping_us=80.0,
                 at="12:00:00", scripts={"schedule": (1.0, 30.0), INSIDE + "set": (1.0, 2.0),
                                         "ping": (0.001, 0.01)})
    assert script_notes([logged]) == [
        "single, working tree: 30.0 us in all: schedule 1.00 calls 30.0 us; "
        "in scripts: set 1.00 calls 2.0 us"]
    assert script_notes([Run(0, "single", WORKING_TREE, {}, load1=1.0, ping_us=80.0,
                             at="12:00:00", error="exit 1")]) == []


def test_the_revision_s_venv_gets_this_venv_s_event_loop_and_parser() -> None:
    """A side without uvloop runs its async fires slower: both sides get the same."""
    argv = compare.rev_install(Path("/rev/venv/bin/python"), Path("/rev/src"))
    assert argv[:6] == ["/rev/venv/bin/python", "-m", "pip", "install", "-q", "/rev/src"]
    assert sorted(pin.partition("==")[0] for pin in argv[6:]) == ["hiredis", "uvloop"]
    assert set(argv[6:]) == set(compare.speed_pins())
