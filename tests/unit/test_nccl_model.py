"""NCCL's mechanisms in the model (#25): the pipelined hierarchical schedules verified and emulated, channels
striped over the rails, protocols with NCCL's latencies, pipelining by default, the presets, the chooser's
(algorithm, parameters, reason), and the Chrome trace."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from collectives import algorithms, emulate, verify
from collectives.choice import select
from collectives.cli import main
from collectives.simulate import simulate
from collectives.topology import cluster, fully_connected, preset


def check(sched, coll: str, count: int) -> None:
    """verify() and emulate() on int64 inputs, bitwise against numpy."""
    verify(sched, itemsize=8)
    p = sched.world_size
    rng = np.random.default_rng(1)
    xs = [rng.integers(-1000, 1000, count).astype(np.int64) for _ in range(p)]
    total = np.sum(xs, axis=0, dtype=np.int64) if count else xs[0].copy()
    for r, out in enumerate(emulate(sched, xs)):
        if coll == "allreduce":
            want = total
        elif coll == "reduce_scatter":
            k = count // p
            want = total[r * k:(r + 1) * k]
        else:
            want = np.concatenate(xs)
        assert np.array_equal(out, want), (sched.algorithm, coll, p, count, r)


@pytest.mark.parametrize("name", ["nvls_tree", "collnet_direct", "collnet_chain"])
@pytest.mark.parametrize("d,g", [(2, 1), (2, 3), (3, 2), (4, 4), (5, 2)])
def test_pipelined_hierarchies_verify_and_emulate(name, d, g):
    t = cluster(domains=d, gpus_per_domain=g, radix=8)
    p = d * g
    for count in (0, 1, 2 * p + 1, 40 * p):
        for chunks in (1, 3):
            s = algorithms.build(name, collective="allreduce", world_size=p, count=count, topology=t, chunks=chunks)
            assert not s.notes and "pipelined" in s.phases[0].name  # the algorithm itself, not a fallback
            check(s, "allreduce", count)


@pytest.mark.parametrize("p", range(1, 10))
def test_pat_verifies_and_emulates(p):
    t = fully_connected(p)
    for coll in ("allgather", "reduce_scatter"):
        for count in ((0, 1, 3) if coll == "allgather" else (0, p, 3 * p)):
            check(algorithms.build("pat", collective=coll, world_size=p, count=count, topology=t), coll, count)


def test_channels_stripe_multi_node_rings_over_every_rail():
    t = preset("dgx-h100", nodes=2)
    default = simulate("ring", t, 8 << 30, mode="analytic")
    one = simulate("ring", t, 8 << 30, mode="analytic", channels=1)
    assert default.channels == t.runtime.channels(True) and default.channels >= 8
    assert default.busbw > 300e9  # NVIDIA/nccl#1221 measures ~330 GB/s; one channel is one NIC
    assert one.busbw < 60e9


def test_protocols_small_latency_and_large_bandwidth():
    t = preset("dgx-h100", nodes=2)
    small = simulate("auto", t, 8, mode="analytic")
    large = simulate("ring", t, 1 << 30, mode="analytic")
    assert small.protocol == "LL" and 6e-6 <= small.time <= 25e-6  # NCCL: 6-25 us, not 1-2
    assert simulate("ring", t, 8, mode="analytic").protocol == "LL"
    assert large.protocol == "Simple"
    # the ramp: far from peak at 1 MiB, near it at 1 GiB
    assert simulate("ring", t, 1 << 20, mode="analytic").busbw < 0.5 * large.busbw


def test_nvls_pipelines_by_default():
    t = preset("dgx-h100", nodes=1)
    r = simulate("nvls", t, 1 << 30, mode="analytic")
    assert r.params["chunks"] > 1
    assert r.busbw > simulate("nvls", t, 1 << 30, mode="analytic", chunks=1).busbw * 1.2


@pytest.mark.parametrize("name,size", [("dgx-h100", "nodes"), ("dgx-h200", "nodes"), ("dgx-b200", "nodes"),
                                       ("dgx-b300", "nodes"), ("gb200-nvl72", "racks"), ("gb300-nvl72", "racks")])
def test_presets_and_overrides(name, size):
    t = preset(name, **{size: 2})
    assert t.num_domains == 2 and t.runtime is not None
    assert t.gpus_per_domain == (8 if name.startswith("dgx") else 72)
    four = preset(name, **{size: 3}, gpus_per_domain=4)
    assert four.world_size == 12
    with pytest.raises(ValueError, match="unknown preset"):
        preset(name, gpus=3)


def test_select_gives_algorithm_parameters_and_reason_cheaply():
    t = preset("dgx-h100", nodes=2)
    name, params, reason = select("allreduce", 64 << 20, t)
    assert name in algorithms.names("allreduce") and "protocol" in params and "fastest" in reason
    t0 = time.perf_counter()
    for _ in range(100):
        assert select("allreduce", 64 << 20, t) == (name, params, reason)
    assert time.perf_counter() - t0 < 0.5  # cached
    only, _, why = select("allreduce", 64 << 20, t, candidates=["ring"])
    assert only == "ring" and "only" in why
    r = simulate("auto", t, 64 << 20, mode="analytic")
    assert r.algorithm == name and r.protocol == params["protocol"]


def test_trace_is_a_chrome_trace(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["simulate", "--preset", "dgx-h100", "--nodes", "2", "--set", "channels=2", "--algorithms", "ring",
                 "-b", "1M", "-e", "1M", "--trace", str(path)]) == 0
    assert "trace:" in capsys.readouterr().out
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert slices and meta
    for e in slices:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0
    assert {e["pid"] for e in slices} >= set(range(16))  # one process per rank
    names = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert "rounds" in names and any(n.startswith(("out:", "in:")) for n in names)
