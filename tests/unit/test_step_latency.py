"""Small calls on NCCL clusters (#25, acceptance point 7): a step waits for its sender's data and a free buffer
slot, not for its receiver (recurrence.py, event.py), small calls run on NCCL's channel count for their size,
NCCL's step latency is a step's whole latency, and the results land within 1.5x of NCCL's own formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collectives.simulate import simulate
from collectives.simulator import recurrence
from collectives.topology import preset
from collectives.topology.runtime import BASE_LATENCY_US, NET_OVERHEAD_US, STEP_LATENCY_US

US = 1e-6
LL = 0


def path_latency(t, a: int, b: int) -> float:
    links = t.path_links(np.array([a]), np.array([b]))
    return float(t.link_latency(links[links >= 0]).sum())


def phase(result, prefix: str) -> float:
    return sum(p.time for p in result.phases if p.name.startswith(prefix))


def test_ring_steps_cross_the_network_only_where_a_chunk_does():
    """8 B over 2 x 8 H100 in LL: one channel (NCCL's count for 8 B), and each half's critical path is a chunk's
    way round the ring (13 NVLink hops, 2 network hops), not 15 network hops (the rendezvous rule's answer)."""
    t = preset("dgx-h100", nodes=2)
    r = simulate("ring", t, 8, mode="analytic", protocol="LL")
    assert r.channels == 1
    nv, net = path_latency(t, 0, 1), path_latency(t, 0, 8)
    assert phase(r, "ring reduce-scatter") == pytest.approx(13 * nv + 2 * net, rel=1e-4)
    assert phase(r, "ring allgather") == pytest.approx(13 * nv + 2 * net, rel=1e-4)
    # across nodes a ring's NVLink step costs at least NCCL's network overhead (src/graph/tuning.cc)
    step_nv = max(STEP_LATENCY_US["nvlink"]["ring"][LL], NET_OVERHEAD_US) * US
    step_net = STEP_LATENCY_US["net"]["ring"][LL] * US
    assert t.runtime.step_latency("ring", "LL", "nvlink") == pytest.approx(step_nv, rel=1e-12)
    # the steps' excess over their paths along a chunk's way: 30 consecutive steps of the ring (7 NVLink, one
    # network, 7 NVLink, one network), the slowest such window
    extra = [max(step_nv - nv, 0)] * 7 + [max(step_net - net, 0)] + [max(step_nv - nv, 0)] * 7 + \
        [max(step_net - net, 0)]
    want = BASE_LATENCY_US["ring"][LL] * US + max(sum(extra[(k + j) % 16] for j in range(30)) for k in range(16))
    assert phase(r, "NCCL call latency") == pytest.approx(want, rel=1e-9)
    e = simulate("ring", t, 8, mode="event", protocol="LL")
    assert e.time == pytest.approx(r.time, rel=1e-3)


def test_small_calls_run_on_nccls_channel_count():
    """src/enqueue.cc: while nBytes < nc x threads x threadThreshold, one channel fewer (ring LL: 8 B x ranks)."""
    t = preset("dgx-h100", nodes=2)
    rt = t.runtime
    assert rt.call_channels("ring", "LL", 8, 16, 16) == 1
    assert rt.call_channels("ring", "LL", 2 * 512 * 8 * 16, 16, 16) == 2
    assert rt.call_channels("ring", "Simple", 1 << 30, 16, 16) == 16
    assert rt.call_channels("nvls", "Simple", 8, 16, 16) == 16
    assert simulate("ring", t, 1 << 30, mode="analytic").channels == 16
    assert simulate("ring", t, 8, mode="analytic", channels=4).channels == 4  # asked for: kept


def _ring(d: np.ndarray):
    n = d.size
    src = np.arange(n, dtype=np.int64)
    return recurrence.scatter(src, (src + 1) % n, np.zeros(0, np.int64))


@pytest.mark.parametrize("slots", [1, 3, 8])
def test_a_repeated_round_is_the_recurrence_applied_repeatedly(slots):
    rng = np.random.default_rng(3)
    d = rng.choice([0.6, 2.7], size=16)
    sc = _ring(d)
    zero, back = np.zeros(16), np.full(16, slots)

    def advance(H):
        return recurrence.advance_history(H, sc, back, d, zero, None, False)

    H = np.tile(rng.uniform(0, 5, size=16), (slots, 1))
    want = H
    for _ in range(40):
        want = np.vstack((want[1:], advance(want)[None, :]))
    got = recurrence.iterate(H, 40, advance, rate=0.0, work=32)
    assert np.allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("period", [1, 2, 5])
def test_a_periodic_steady_state_is_extrapolated_by_whole_periods(period):
    # every node's time grows by a pattern of `period` increments (a max-plus map's eventual cyclicity): the
    # iteration recognises it after a few periods and extrapolates the rest, as the exact iteration gives
    slots, nodes = 3, 4
    pattern = np.array([1.0, 3.0, 0.5, 2.0, 7.0])[:period]
    calls = []

    def advance(H):
        k = len(calls)
        calls.append(k)
        return H[-1] + pattern[k % period] * np.arange(1, nodes + 1)

    H = np.zeros((slots, nodes))
    want = H
    for k in range(1000):
        want = np.vstack((want[1:], (want[-1] + pattern[k % period] * np.arange(1, nodes + 1))[None, :]))
    got = recurrence.iterate(H, 1000, advance, rate=np.nan, work=1)
    assert np.allclose(got, want, rtol=1e-12)
    assert len(calls) <= 2 * period * (1 + slots) + 2 * period  # not 1,000 rounds


def test_sender_driven_ring_follows_a_chunk():
    """With the credit out of reach, after k rounds each node has waited for the slowest k consecutive hops
    before it (a chunk's way), never k x the slowest hop."""
    d = np.array([0.6] * 7 + [2.7] + [0.6] * 7 + [2.7])
    sc = _ring(d)
    back = np.full(16, 8)
    H = recurrence.iterate(np.zeros((8, 16)), 15, lambda X: recurrence.advance_history(
        X, sc, back, d, np.zeros(16), None, False), rate=0.0, work=32)
    windows = [max(sum(d[(v - 1 - j) % 16] for j in range(k)) for k in range(16)) for v in range(16)]
    assert np.allclose(H[-1], windows)
    assert H[-1].max() == pytest.approx(13 * 0.6 + 2 * 2.7)


def test_cycle_rate_of_a_ring_is_its_mean_step():
    d = np.array([0.6] * 7 + [2.7] + [0.6] * 7 + [2.7])
    src = np.arange(16, dtype=np.int64)
    rows = recurrence.cycle_rows(src, (src + 1) % 16, d, np.zeros(16), 0.0, 16, 8)
    assert recurrence.rate_at(rows, 0.0) == pytest.approx(d.mean())
    # one slot (rendezvous): the slowest message sets the rate
    rows = recurrence.cycle_rows(src, (src + 1) % 16, d, np.zeros(16), 0.0, 16, 1)
    assert recurrence.rate_at(rows, 0.0) == pytest.approx(2.7)
    # a message and its reverse (a tree's up and down in one round) make a cycle of two
    rows = recurrence.cycle_rows(np.array([0, 1]), np.array([1, 0]), np.array([1.0, 3.0]), np.zeros(2), 0.0, 2, 8)
    assert recurrence.rate_at(rows, 0.0) == pytest.approx(2.0)


def nccl_formula_us(algorithm: str, ranks: int, nodes: int) -> float:
    """src/graph/tuning.cc, ncclTopoTuneModel, allreduce in LL (the protocol NCCL picks at 8 B): ring
    baseLat + (nsteps - nInterSteps) x max(intraLat, netOverhead 1.0) + nInterSteps x interLat; tree
    baseLat + 2 x ((ppn - 1) x intraLat + log2(nNodes) x interLat)."""
    if algorithm == "ring":
        intra = max(STEP_LATENCY_US["nvlink"]["ring"][LL], 1.0 if nodes > 1 else 0.0)
        inter = 2 * (nodes - 1)
        net = STEP_LATENCY_US["net"]["ring"][LL]
        return BASE_LATENCY_US["ring"][LL] + (2 * (ranks - 1) - inter) * intra + inter * net
    ppn = ranks // nodes
    return BASE_LATENCY_US["tree"][LL] + 2 * ((ppn - 1) * STEP_LATENCY_US["nvlink"]["tree"][LL]
                                             + math.log2(nodes) * STEP_LATENCY_US["net"]["tree"][LL])


@pytest.mark.parametrize("algorithm", ["ring", "double_binary_tree"])
@pytest.mark.parametrize("name,nodes", [("dgx-h100", 1), ("dgx-h100", 2), ("dgx-h100", 4), ("gb200-nvl72", 1),
                                        ("gb200-nvl72", 2)])
def test_small_allreduce_within_one_and_a_half_of_nccls_formula(algorithm, name, nodes):
    t = preset(name, **{"nodes" if name.startswith("dgx") else "racks": nodes})
    want = nccl_formula_us(algorithm, t.world_size, nodes) * US
    r = simulate(algorithm, t, 8, mode="analytic")
    assert want / 1.5 <= r.time <= 1.5 * want, (algorithm, nodes, r.time / want)
