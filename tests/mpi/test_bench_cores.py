"""The shared-core bound of `bench --predict` (collectives/benchmark/cores.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from collectives.benchmark.cores import (
    core_share,
    cpu_work_seconds,
    link_shared_core_time,
    shm_shared_core_time,
)
from collectives.benchmark.runner import Predictor
from collectives.benchmark.shm_cost import critical_path, processor_seconds, rank_steps
from collectives.simulate import simulate
from collectives.simulator.engine import build_schedule
from collectives.topology import from_dict, preset, save
from collectives.transport.shm_plan import ShmPlan


def test_core_share_is_ranks_per_core_and_one_without_a_core_count():
    assert core_share({"ranks": 4, "ranks_per_host": 4, "cores": 2}) == 2.0
    assert core_share({"ranks": 8, "ranks_per_host": 4, "cores": 2}) == 2.0  # per host, not per job
    assert core_share({"ranks": 2, "ranks_per_host": 2, "cores": 4}) == 1.0
    assert core_share({"ranks": 4}) == 1.0  # calibrations from before core counts: unchanged predictions
    assert core_share(None) == 1.0


def _plans(algorithm: str, p: int, count: int):
    schedule = build_schedule(algorithm, preset("loopback", ranks=p), "allreduce", count)
    return [ShmPlan.build(schedule, rank) for rank in range(p)]


def _priced(plans, copy_s: float, extra_s: float):
    return [rank_steps(plan, 4, copy_s, extra_s) for plan in plans]


def test_a_ring_costs_a_copy_round_per_received_byte_and_a_reduce_per_reduced_byte():
    p, count = 4, 4096
    plans, D = _plans("ring", p, count), count * 4
    # each rank receives 2(p-1) pieces of D/p (one mirror + one landing each) and reduces p-1 of them
    assert processor_seconds(_priced(plans, 0.5, 0.0)) == pytest.approx(2 * (p - 1) * D)
    assert processor_seconds(_priced(plans, 0.0, 1.0)) == pytest.approx((p - 1) * D)


def test_a_double_binary_tree_fuses_same_range_receives_and_mirrors_once_for_two_readers():
    """p = 4: the inner ranks reduce half the buffer from two children in one landing and mirror one range for
    two readers. Over all ranks: 10 mirrors, 6 landings and 4 fused reduces of half the buffer (20 copies), and
    6 reduced inputs of half the buffer; the simulator's links charge 12 copy rounds (24 copies)."""
    p, count = 4, 4096
    plans, half = _plans("double_binary_tree", p, count), count * 4 // 2
    assert processor_seconds(_priced(plans, 1.0, 0.0)) == pytest.approx(20 * half)
    assert processor_seconds(_priced(plans, 0.0, 1.0)) == pytest.approx(6 * half)


@pytest.mark.parametrize(("algorithm", "rounds"), [("ring", 6), ("double_binary_tree", 4), ("rabenseifner", 4)])
def test_with_no_data_the_path_is_one_latency_per_round(algorithm, rounds):
    plans = _plans(algorithm, 4, 4096)
    assert critical_path(plans, _priced(plans, 0.0, 0.0), 1e-6).seconds == pytest.approx(rounds * 1e-6)


def test_a_ring_never_blocks_and_a_tree_does():
    """A ring's ranks finish every round together (each wait costs the latency only); a tree's leaves wait for
    their parents' reductions, and each such wait costs the handoff on top."""
    ring, tree = _plans("ring", 4, 1 << 16), _plans("double_binary_tree", 4, 1 << 16)
    ring_path = critical_path(ring, _priced(ring, 1e-9, 1e-9), 1e-6, handoff=5e-6)
    assert ring_path.blocked_waits == 0
    steps = _priced(tree, 1e-9, 1e-9)
    without, with_handoff = critical_path(tree, steps, 1e-6), critical_path(tree, steps, 1e-6, handoff=5e-6)
    assert with_handoff.blocked_waits > 0
    assert with_handoff.seconds > without.seconds


def test_plans_that_wait_on_each_other_in_a_cycle_are_reported():
    def plan(peer: int):  # waits for the peer's done >= 5, which nobody publishes
        rnd = SimpleNamespace(k=0, groups=[], data_waits=[(peer, 5)], mirror=[], mirror_waits=[], advance_to=2,
                              copy_next=[])
        return SimpleNamespace(rounds=[rnd], copy_in=[], start_offset=1, never_written=[])

    plans = [plan(1), plan(0)]
    with pytest.raises(RuntimeError, match="cycle"):
        critical_path(plans, _priced(plans, 1.0, 1.0), 1e-6)


def _loopback(p: int) -> dict:
    return preset("loopback", ranks=p, nvlink_bandwidth=2e9, nvlink_latency=5e-6,
                  reduce_bandwidth={"float32": 4e9, "default": 4e9}).to_dict()


def _shared(algorithm: str, p: int, nbytes: int, handoff: float = 0.0) -> float:
    schedule = build_schedule(algorithm, from_dict(_loopback(p)), "allreduce", nbytes // 4)
    return shm_shared_core_time(schedule, world_size=p, itemsize=4, bandwidth=2e9, reduce_rate=4e9, latency=10e-6,
                            handoff=handoff, share=2.0, cores=2)


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_a_schedule_that_keeps_every_rank_busy_is_priced_as_the_plain_simulation(algorithm):
    p, nbytes = 4, 16 << 20
    plain = simulate(algorithm, from_dict(_loopback(p)), nbytes).time
    assert _shared(algorithm, p, nbytes) == pytest.approx(plain, rel=0.02)
    assert _shared(algorithm, p, nbytes, handoff=5e-6) == pytest.approx(plain, rel=0.02)  # nobody blocks


def test_a_tree_that_idles_ranks_is_faster_on_shared_cores_than_the_plain_simulation_says():
    """dbt at p=4 keeps at most two ranks reducing: on 2 cores they run at full speed, and its fused receives do
    less work than a ring's (20 copies of half the buffer against 24), so it is priced under both the plain
    simulation and the ring on shared cores; blocked waits raise its price."""
    p, nbytes = 4, 16 << 20
    plain = simulate("double_binary_tree", from_dict(_loopback(p)), nbytes).time
    shared = _shared("double_binary_tree", p, nbytes)
    assert shared < 0.75 * plain
    assert shared < 0.95 * _shared("ring", p, nbytes)
    assert _shared("double_binary_tree", p, nbytes, handoff=50e-6) > shared


def test_predictor_applies_the_bound_only_when_the_calibration_counts_fewer_cores_than_ranks(tmp_path):
    p = 4
    sizes = [64 << 10, 64 << 20]
    calibration = {"ranks": p, "window_s": {k: [[s, v] for s in sizes] for k, v in
                                            (("mirror", 1e-4), ("land", 1e-4), ("reduce", 3e-4))},
                   "round_s": 1e-5, "call_overhead_s": 0.0, "exchange_s": [[s, 1e-3] for s in sizes],
                   "reduce_curve": {"float32": [[s, 1e10] for s in sizes]}}

    def predict(extra: dict) -> float:
        path = tmp_path / f"cal{len(extra)}.json"
        save(preset("loopback", ranks=p), path)
        data = json.loads(path.read_text())
        data["calibration"] = {**calibration, **extra}
        path.write_text(json.dumps(data))
        return Predictor(str(path), p, np.dtype(np.float32), "sum", 0).predict("allreduce", "double_binary_tree",
                                                                               {}, 16 << 20)

    plain = predict({})
    assert predict({"cores": 4, "ranks_per_host": 4}) == pytest.approx(plain)
    assert predict({"cores": 2, "ranks_per_host": 4}) < 0.75 * plain


def test_a_calibration_without_sharing_still_charges_a_larger_run_to_the_cores(tmp_path):
    """Calibrated with 2 ranks on 2 cores (share 1), predicting 4 ranks: the rates are full-core rates, and the
    4 ranks' work has 2 cores, so ring costs about its processor time, not the plain simulation."""
    sizes = [64 << 10, 64 << 20]
    path = tmp_path / "cal.json"
    save(preset("loopback", ranks=2), path)
    data = json.loads(path.read_text())
    data["calibration"] = {"ranks": 2, "cores": 2, "ranks_per_host": 2, "round_s": 1e-5, "call_overhead_s": 0.0,
                           "window_s": {k: [[s, 1e-4] for s in sizes] for k in ("mirror", "land", "reduce")},
                           "exchange_s": [[s, 1e-3] for s in sizes], "reduce_curve": {"float32": [[s, 1e10] for s in sizes]}}
    path.write_text(json.dumps(data))
    pred = Predictor(str(path), 4, np.dtype(np.float32), "sum", 0)
    nbytes = 16 << 20
    plain = simulate("ring", pred.topology_for(nbytes), nbytes).time
    assert pred.predict("allreduce", "ring", {}, nbytes) > 1.5 * plain



def test_link_bound_counts_every_received_and_reduced_byte():
    """Schedules with switch nodes keep the links' bound: received bytes at the copy rate, reduced bytes at the
    reduction rate (ring allreduce: 2(p-1) pieces of D/p received, p-1 reduced)."""
    p, count = 4, 4096
    schedule = build_schedule("ring", preset("loopback", ranks=p), "allreduce", count)
    D = count * 4
    assert cpu_work_seconds(schedule, p, 4, bandwidth=1.0, reduce_rate=1e300) == pytest.approx(2 * (p - 1) * D)
    assert cpu_work_seconds(schedule, p, 4, bandwidth=1e300, reduce_rate=1.0) == pytest.approx((p - 1) * D)


def test_a_schedule_with_a_switch_node_is_priced_by_the_links_bound(tmp_path, capsys):
    """nvls on the loopback host has a switch node (emulated by a rank over messages, not shared memory): the
    shared-memory plans cannot price it, the links' bound does."""
    p, nbytes = 4, 16 << 20
    sizes = [64 << 10, 64 << 20]
    path = tmp_path / "cal.json"
    save(preset("loopback", ranks=p), path)
    data = json.loads(path.read_text())
    data["calibration"] = {"ranks": p, "cores": 2, "ranks_per_host": p, "round_s": 1e-5, "sync_round_s": 2e-5,
                           "call_overhead_s": 0.0,
                           "window_s": {k: [[s, 1e-4] for s in sizes] for k in ("copy_round", "reduce_round")},
                           "exchange_s": [[s, 1e-3] for s in sizes],
                           "reduce_curve": {"float32": [[s, 1e10] for s in sizes]}}
    path.write_text(json.dumps(data))
    pred = Predictor(str(path), p, np.dtype(np.float32), "sum", 0)
    topo = pred.topology_for(nbytes)
    schedule = build_schedule("nvls", topo, "allreduce", nbytes // 4)
    assert schedule.num_nodes > p
    expected = link_shared_core_time(lambda d: simulate("nvls", from_dict(d), nbytes).time, topo.to_dict(),
                                     schedule, world_size=p, itemsize=4,
                                     reduce_rate=float(topo.reduce_throughput("float32")), share=2.0, cores=2)
    assert pred.predict("allreduce", "nvls", {}, nbytes) == pytest.approx(expected)


def test_a_changed_placement_of_the_cores_is_over_3x_either_way():
    """One placement's probes spread 25-60 ns on the development VM, the other sits at 205-250 ns."""
    from collectives.benchmark.host_state import state_changed

    assert not state_changed(40e-9, 60e-9) and not state_changed(60e-9, 25e-9)
    assert state_changed(40e-9, 240e-9) and state_changed(240e-9, 40e-9)
    assert not state_changed([38e-9, 24e-9], 53e-9)  # against the calibration's probes' geometric mean
    assert state_changed([38e-9, 24e-9], 250e-9)
    assert state_changed([246e-9, 53e-9], 49e-9)  # the calibration saw both placements: it describes neither
    assert not state_changed(None, 40e-9) and not state_changed(40e-9, None)  # nothing to compare
    assert not state_changed([], 40e-9) and not state_changed([40e-9, None], 240e-9)


def test_the_core_distance_probe_needs_a_second_rank_on_the_host():
    """One rank alone on its host has nobody to bounce a cache line with: the probe is None on every rank."""
    from mpi4py import MPI

    from collectives.benchmark.host_state import CoreDistance

    probe = CoreDistance(MPI.COMM_SELF)
    try:
        assert probe.measure() is None
    finally:
        probe.close()


def test_core_mates_are_found_only_where_binding_puts_them_at_a_fixed_distance():
    from collectives.benchmark.calibrate import mate_shift_of

    a, b, c, d = (frozenset({i}) for i in range(4))
    both = frozenset({0, 1})
    assert mate_shift_of([a, b, a, b]) == 2  # mpiexec -bind-to core -n 4 on 2 cores
    assert mate_shift_of([a, b, a, b, a, b]) == 2
    assert mate_shift_of([a, b, c, a, b, c]) == 3
    assert mate_shift_of([a, b, c, d]) is None  # a core each
    assert mate_shift_of([a, a, b, b]) is None  # the left neighbour shares the core: calibrate's rounds would not cross
    assert mate_shift_of([both] * 4) is None  # unbound: the OS decides who shares a core
    assert mate_shift_of([a, b]) is None


def test_mates_ratio_is_the_mates_round_over_the_crossing_one_and_at_most_one():
    from collectives.benchmark.calibrate import mate_ratio

    sizes = [1 << 20, 64 << 20]
    cal = {"window_s": {"copy_round": [[s, 300e-6] for s in sizes]},
           "window_mates_s": {"copy_round": [[1 << 20, 100e-6], [64 << 20, 330e-6]]}}
    assert mate_ratio(cal, 1 << 20) == pytest.approx(1 / 3)
    assert mate_ratio(cal, 64 << 20) == 1.0  # dearer between mates is noise: no cheaper than crossing
    assert mate_ratio({"window_s": cal["window_s"]}, 1 << 20) is None


def _mates_price(algorithm: str, ratio: float | None) -> float:
    p, count = 4, 1 << 16
    schedule = build_schedule(algorithm, from_dict(_loopback(p)), "allreduce", count)
    return shm_shared_core_time(schedule, world_size=p, itemsize=4, bandwidth=2e9, reduce_rate=1e300, latency=0.0,
                                handoff=0.0, share=2.0, cores=2, mates=None if ratio is None else (2, ratio))


def test_transfers_between_core_mates_cost_a_local_copy_and_crossings_the_rest_of_a_round():
    """ranks r and r + 2 share a core; a copy round across cores is a local copy (the mirror, ratio / 2 of it) and
    a crossing (1 - ratio / 2), between mates two local copies. A ring crosses in every round, so its price does
    not depend on the ratio; rabenseifner's first and last exchanges (two thirds of its bytes) are between mates:
    its work over all ranks is (4 ratio + 2) x D of round-seconds against the ring's 6 D. With a ratio of 1 the
    prices are the ones without mates."""
    for algorithm in ("ring", "rabenseifner", "double_binary_tree"):
        assert _mates_price(algorithm, 1.0) == pytest.approx(_mates_price(algorithm, None))
    assert _mates_price("ring", 0.3) == pytest.approx(_mates_price("ring", None))
    plans, D = _plans("rabenseifner", 4, 4096), 4096 * 4
    ratio = 0.4
    local, crossing = ratio / 2, 1 - ratio / 2
    steps = [rank_steps(plan, 4, local, 0.0, lambda q, me=rank: local if (q - me) % 2 == 0 else crossing)
             for rank, plan in enumerate(plans)]
    assert processor_seconds(steps) == pytest.approx((4 * ratio + 2) * D)
    assert _mates_price("rabenseifner", ratio) < 0.75 * _mates_price("ring", ratio)
    # the tree's fused reduce reads two crossing windows: it pays both crossings
    tree = _plans("double_binary_tree", 4, 4096)
    inner = rank_steps(tree[1], 4, local, 0.0, lambda q: local if (q - 1) % 2 == 0 else crossing)
    half = D // 2
    assert inner.rounds[0][0] == pytest.approx(half * (local + 2 * (crossing - local)))


def test_predictor_prices_core_mates_only_for_the_job_size_it_calibrated(tmp_path):
    p, sizes = 4, [64 << 10, 64 << 20]
    base = {"ranks": p, "cores": 2, "ranks_per_host": p, "round_s": 1e-5, "sync_round_s": 1e-5,
            "call_overhead_s": 0.0, "exchange_s": [[s, 1e-3] for s in sizes],
            "reduce_curve": {"float32": [[s, 1e10] for s in sizes]},
            "window_s": {"copy_round": [[s, 1e-3] for s in sizes], "reduce_round": [[s, 1.2e-3] for s in sizes]}}
    mates = {"core_mate_shift": 2, "window_mates_s": {"copy_round": [[s, 0.3e-3] for s in sizes],
                                                      "reduce_round": [[s, 0.5e-3] for s in sizes]}}

    def predict(calibration: dict, world: int, algorithm: str) -> float:
        path = tmp_path / "cal.json"
        save(preset("loopback", ranks=p), path)
        data = json.loads(path.read_text())
        data["calibration"] = calibration
        path.write_text(json.dumps(data))
        return Predictor(str(path), world, np.dtype(np.float32), "sum", 0).predict("allreduce", algorithm, {},
                                                                                  16 << 20)

    with_mates = {**base, **mates}
    assert predict(with_mates, 4, "ring") == pytest.approx(predict(base, 4, "ring"))
    assert predict(with_mates, 4, "rabenseifner") < 0.8 * predict(base, 4, "rabenseifner")
    # another job size: who shares a core with whom is not known, so no mates
    assert predict(with_mates, 6, "rabenseifner") == pytest.approx(predict(base, 6, "rabenseifner"))
