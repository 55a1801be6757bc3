"""The capacity model's arithmetic (bench/capacity_model.py) and the checks' figures
(bench/capacity.py's pure parts): ceilings, the side that saturates first, memory, ratios."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench import capacity_model as model
from bench.capacity import Check, FireRun, checks_of, phase_of, split_by_phase
from bench.compare import INSIDE

PARTS = model.Parts(schedule_us=50.0, fire_sync_us=30.0, fire_async_us=20.0,
                    listener_sync_us=100.0, listener_async_us=50.0, bytes_near=500.0,
                    bytes_far=300.0, bytes_history=200.0, cluster_schedule_us=50.0,
                    cluster_fire_us=30.0, cluster_listener_us=100.0)
ONE = {"cluster": False}


def test_a_timer_costs_its_fire_and_its_schedule_in_a_steady_state() -> None:
    assert PARTS.redis_us() == 80.0
    assert PARTS.redis_us("async") == 70.0
    assert PARTS.redis_us(scheduled=False) == 30.0
    assert PARTS.listener_us("sync", task_us=25.0) == 125.0
    assert PARTS.listener_us("async") == 50.0


def test_a_cluster_has_costs_of_its_own() -> None:
    parts = replace(PARTS, cluster_schedule_us=60.0, cluster_fire_us=90.0,
                    cluster_listener_us=120.0)
    assert parts.redis_us(cluster=True) == 150.0
    assert parts.redis_us(scheduled=False, cluster=True) == 90.0
    assert parts.listener_us(task_us=5.0, cluster=True) == 125.0
    assert model.ceiling(parts, 3, 1).redis == pytest.approx(3e6 / 150)
    assert model.ceiling(parts, 1, 1, cluster=False).redis == pytest.approx(1e6 / 80)
    with pytest.raises(ValueError):
        model.ceiling(parts, 3, 1, cluster=False)


def test_redis_ceiling_grows_with_the_primaries_and_shrinks_with_imbalance() -> None:
    one = model.ceiling(PARTS, 1, 1)
    assert one.redis == pytest.approx(1e6 / 80)
    assert model.ceiling(PARTS, 12, 1).redis == pytest.approx(12 * one.redis)
    assert model.ceiling(PARTS, 3, 1, imbalance=1.5).redis == pytest.approx(2 * one.redis)


def test_the_lower_ceiling_is_the_rate_and_names_the_side_that_saturates() -> None:
    few = model.ceiling(PARTS, 12, 1)  # 10,000/s of listener against 150,000/s of Redis
    assert few.rate == pytest.approx(10_000)
    assert few.bound == model.LISTENERS
    many = model.ceiling(PARTS, 1, 16)  # 12,500/s of Redis against 160,000/s
    assert many.rate == pytest.approx(12_500)
    assert many.bound == model.REDIS
    assert math.isinf(many.machine)


def test_shared_cores_bound_redis_and_listeners_together() -> None:
    # 2 cores, 30 + 100 us a fire of timers already scheduled: 15,385/s, below both
    # one Redis core (33,333/s) and two listener cores (20,000/s)
    c = model.ceiling(PARTS, 1, 2, scheduled=False, shared_cores=2, cluster=False)
    assert c.machine == pytest.approx(2e6 / 130)
    assert c.rate == c.machine
    assert c.bound == model.MACHINE


def test_listener_cores_to_match_the_redis_ceiling() -> None:
    # 3 primaries: 37,500/s at 80 us; each fire takes 100 us of listener: 3.75 cores
    assert model.listener_cores_to_match(PARTS, 3) == pytest.approx(3.75)
    assert model.listener_cores_to_match(PARTS, 3, task_us=100.0) == pytest.approx(7.5)


def test_pending_capacity_leaves_room_for_each_shards_history() -> None:
    usable = 1_000_000_000.0
    # 100,000 records of 200 B = 20 MB of history a primary; 980 MB / 300 B a timer
    assert model.pending_capacity(PARTS, 1, usable) == 3_266_666
    assert model.pending_capacity(PARTS, 3, usable) == 9_800_000
    assert model.pending_capacity(PARTS, 1, usable, far=False) == 1_960_000
    assert model.pending_capacity(PARTS, 1, 10_000_000.0) == 0


def test_primaries_for_a_number_of_pending_timers() -> None:
    assert model.primaries_for(PARTS, 9_800_000, 1e9) == 3
    assert model.primaries_for(PARTS, 9_800_001, 1e9) == 4
    assert model.primaries_for(PARTS, 1, 1e9) == 1
    with pytest.raises(ValueError):
        model.primaries_for(PARTS, 1, 1e6)


def test_the_table_has_a_row_per_primary_count_and_a_column_per_core_count() -> None:
    parts = replace(PARTS, cluster_fire_us=70.0)
    rows = model.table(parts, primaries=(1, 3), cores=(1, 4), usable_bytes=1e9)
    assert [(r.label, r.primaries) for r in rows] == [
        ("one server", 1), ("1 primary", 1), ("3 primaries", 3)]
    assert rows[0].redis == pytest.approx(12_500)  # one server: 30 + 50 us
    assert rows[2].redis == pytest.approx(25_000)  # 3 primaries: 70 + 50 us each
    assert rows[2].redis_fires_only == pytest.approx(3e6 / 70)
    assert rows[2].cores == pytest.approx(2.5)
    assert rows[2].processes == 0.0  # no rate measured: any number keeps up
    assert [c for c, _ in rows[0].by_cores] == [1, 4]
    assert rows[0].by_cores[0][1].bound == model.LISTENERS
    assert rows[0].by_cores[1][1].bound == model.REDIS
    assert rows[2].pending_far == 9_800_000


def test_bad_shapes_are_refused() -> None:
    for primaries, cores in ((0, 1), (1, 0)):
        with pytest.raises(ValueError):
            model.ceiling(PARTS, primaries, cores)
    with pytest.raises(ValueError):
        model.ceiling(PARTS, 1, 1, imbalance=0.5)


def test_ratio_and_imbalance() -> None:
    assert model.ratio(3.0, 2.0) == 1.5
    assert math.isnan(model.ratio(1.0, 0.0))
    assert model.imbalance_of([1.0, 1.0, 1.0]) == 1.0
    assert model.imbalance_of([2.0, 1.0, 0.0]) == 2.0
    assert math.isnan(model.imbalance_of([]))


def test_scripts_fall_into_the_parts_of_a_timers_life() -> None:
    assert phase_of("schedule") == "schedule"
    assert [phase_of(s) for s in ("claim", "park", "near")] == ["claim"] * 3
    assert phase_of("finish") == "ending"
    assert phase_of("renew") == phase_of("heartbeat") == phase_of("trim") == "run bookkeeping"


def test_the_cpu_is_split_in_the_shares_of_the_logged_time() -> None:
    logged = {"claim": (0.04, 15.0), "finish": (0.02, 5.0), "schedule": (0.002, 8.0),
              INSIDE + "zadd": (1.0, 3.0), "(log full: later commands not counted)": (0, 0)}
    phases, scripts = split_by_phase(40.0, logged, fire=True)
    assert phases == {"claim": 30.0, "ending": 10.0}  # the setup's schedule left out
    assert scripts == {"claim": 15.0, "finish": 5.0}
    phases, _ = split_by_phase(40.0, {"schedule": (1.0, 30.0)}, fire=False)
    assert phases == {"schedule": 40.0}


def fire_run(label: str, rate: float, node_cpu: tuple[float, ...],
             timers: tuple[int, ...], listener_us: float = 100.0) -> FireRun:
    return FireRun(label, 2, sum(timers), rate, listener_us, node_cpu, timers, "1 1 1")


def test_a_shards_cpu_per_fire_is_its_cpu_over_the_fires_it_served() -> None:
    run = fire_run("3", 10_000, (10.0, 10.0, 20.0), (1_000, 1_000, 2_000))
    assert run.redis_us == 40.0
    assert run.per_shard_us == pytest.approx((40.0, 40.0, 40.0))


def test_the_checks_compare_each_run_with_the_models_prediction_for_this_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import capacity

    monkeypatch.setattr(capacity, "SHARED_CORES", 2.0)
    runs = [fire_run("1 server, 1", 10_000, (30.0,), (3_000,)),
            fire_run("1 server, 2", 15_385, (30.0,), (3_000,)),
            fire_run("1 primary", 15_385, (30.0,), (3_000,)),
            fire_run("3 primaries", 15_385, (10.0, 10.0, 10.0), (1_000, 1_000, 1_000))]
    checks = {c.what: c for c in checks_of(PARTS, runs)}
    assert checks["fires/s, one server, 1 listener"].predicted == pytest.approx(10_000)
    assert checks["fires/s, one server, 2 listeners"].ratio == pytest.approx(1.0, rel=1e-3)
    assert checks["3 primaries over 1, listeners fixed (fires/s)"].predicted == 1.0
    assert checks["Redis CPU per fire of shard 2 (3 primaries)"].ratio == 1.0
    assert checks["busiest shard's timers over the mean (3 primaries)"].measured == 1.0
    assert checks["Redis CPU per fire, one server, 2 listeners"].ratio == 1.0
    assert isinstance(checks["listener CPU per fire (cluster of 1 primary)"], Check)


def test_a_listener_process_that_waits_on_round_trips_stops_short_of_a_core() -> None:
    parts = replace(PARTS, process_rate=5_000.0, cluster_process_rate=2_000.0)
    assert parts.busy() == 0.5  # 5,000/s x 100 us
    assert parts.busy(cluster=True) == 0.2
    assert PARTS.busy() == 1.0  # not measured: a whole core
    # two processes: 10,000/s, below their two cores (20,000/s) and Redis (33,333/s)
    c = model.ceiling(parts, 1, 2, scheduled=False, cluster=False, processes=2)
    assert c.listeners == 10_000
    assert c.bound == model.LISTENERS
    assert model.ceiling(parts, 1, 2, scheduled=False, cluster=False).listeners == 20_000
