"""The shared-core bound of `bench --predict` (collectives/benchmark/cores.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collectives.benchmark.cores import core_share, cpu_work_seconds, shared_core_time
from collectives.benchmark.runner import Predictor
from collectives.simulate import simulate
from collectives.simulate.api import build_schedule
from collectives.topology import from_dict, preset, save


def test_core_share_is_ranks_per_core_and_one_without_a_core_count():
    assert core_share({"ranks": 4, "ranks_per_host": 4, "cores": 2}) == 2.0
    assert core_share({"ranks": 8, "ranks_per_host": 4, "cores": 2}) == 2.0  # per host, not per job
    assert core_share({"ranks": 2, "ranks_per_host": 2, "cores": 4}) == 1.0
    assert core_share({"ranks": 4}) == 1.0  # calibrations from before core counts: unchanged predictions
    assert core_share(None) == 1.0


def test_cpu_work_counts_every_received_and_reduced_byte_of_a_ring_allreduce():
    p, count = 4, 4096
    schedule = build_schedule("ring", preset("loopback", ranks=p), "allreduce", count)
    D = count * 4
    # each rank receives 2(p-1) pieces of D/p and reduces p-1 of them
    moved, reduced = 2 * (p - 1) * D, (p - 1) * D
    assert cpu_work_seconds(schedule, p, 4, bandwidth=1.0, reduce_rate=1e300) == pytest.approx(moved)
    assert cpu_work_seconds(schedule, p, 4, bandwidth=1e300, reduce_rate=1.0) == pytest.approx(reduced)


def _loopback(p: int) -> dict:
    return preset("loopback", ranks=p, nvlink_bandwidth=2e9, nvlink_latency=5e-6,
                  reduce_bandwidth={"float32": 4e9, "default": 4e9}).to_dict()


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_a_schedule_that_keeps_every_rank_busy_is_priced_as_the_plain_simulation(algorithm):
    p, nbytes = 4, 16 << 20
    d = _loopback(p)
    plain = simulate(algorithm, from_dict(d), nbytes).time
    schedule = build_schedule(algorithm, from_dict(d), "allreduce", nbytes // 4)
    shared = shared_core_time(lambda q: simulate(algorithm, from_dict(q), nbytes).time, d, schedule, world_size=p,
                              itemsize=4, reduce_rate=4e9, share=2.0, cores=2)
    assert shared == pytest.approx(plain, rel=0.02)


def test_a_tree_that_idles_ranks_is_faster_on_shared_cores_than_the_plain_simulation_says():
    """dbt at p=4 keeps at most two ranks reducing: on 2 cores they run at full speed, so the price falls to the
    processor-time bound (the total work of every rank / 2 cores), well under the plain simulation."""
    p, nbytes = 4, 16 << 20
    d = _loopback(p)
    plain = simulate("double_binary_tree", from_dict(d), nbytes).time
    schedule = build_schedule("double_binary_tree", from_dict(d), "allreduce", nbytes // 4)
    shared = shared_core_time(lambda q: simulate("double_binary_tree", from_dict(q), nbytes).time, d, schedule,
                              world_size=p, itemsize=4, reduce_rate=4e9, share=2.0, cores=2)
    work = cpu_work_seconds(schedule, p, 4, 2e9 * 2, 4e9 * 2) / 2
    assert shared < 0.75 * plain
    assert shared >= work


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

