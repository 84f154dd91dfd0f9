"""alltoall and alltoallv: the contract, and the three schedules verified, emulated bitwise against numpy at world
sizes 1..12 (counts 0 and up, uneven matrices with empty rows and columns) and event-simulated at small scale."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import algorithms, emulate, verify
from collectives.schedule import Schedule
from collectives.schedule.collective import output_blocks
from collectives.simulate import simulate
from collectives.topology import cluster, preset

FLAT = ("pairwise", "bruck")


def reference(counts: np.ndarray, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """numpy alltoallv: rank r's output is block r of every rank's input, in source order."""
    at = np.cumsum(counts, axis=1) - counts
    p = len(inputs)
    return [np.concatenate([inputs[s][at[s, r]:at[s, r] + counts[s, r]] for s in range(p)]) for r in range(p)]


def uneven(p: int, seed: int) -> np.ndarray:
    """Counts 0..5 with an empty row, an empty column and an empty diagonal block (when p allows)."""
    m = np.random.default_rng(seed).integers(0, 6, size=(p, p))
    if p > 1:
        m[p - 1, :] = 0
        m[:, p // 2] = 0
    m[0, 0] = 0
    return m


def build(name: str, collective: str, p: int, *, count=None, counts=None, topology=None) -> Schedule:
    return algorithms.build(name, collective=collective, world_size=p, count=count, counts=counts, topology=topology)


def check(schedule: Schedule, counts: np.ndarray, dtype=np.float32, seed: int = 0) -> None:
    verify(schedule)
    p = schedule.world_size
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(int(counts[r].sum())).astype(dtype) for r in range(p)]
    outputs = emulate(schedule, inputs)
    for r, (got, want) in enumerate(zip(outputs, reference(counts, inputs), strict=True)):
        assert got.dtype == dtype and got.tobytes() == want.tobytes(), f"rank {r}"


@pytest.mark.parametrize("name", FLAT)
def test_flat_uniform_every_world_size(name):
    for p in range(1, 13):
        for k in (0, 3):
            check(build(name, "alltoall", p, count=p * k), np.full((p, p), k), seed=p * 10 + k)


@pytest.mark.parametrize("name", FLAT)
def test_flat_alltoallv_uneven(name):
    for p in (1, 2, 3, 5, 8, 11):
        counts = uneven(p, p)
        check(build(name, "alltoallv", p, counts=counts), counts, dtype=np.int64, seed=p)


@pytest.mark.parametrize("domains, gpus", [(1, 1), (1, 4), (3, 1), (2, 3), (3, 4), (4, 2)])
def test_hierarchical(domains, gpus):
    topo = cluster(domains=domains, gpus_per_domain=gpus, radix=8)
    p = domains * gpus
    check(build("hierarchical_alltoall", "alltoall", p, count=2 * p, topology=topo), np.full((p, p), 2))
    counts = uneven(p, p + 100)
    check(build("hierarchical_alltoall", "alltoallv", p, counts=counts, topology=topo), counts, seed=7)


def test_contract():
    s = build("pairwise", "alltoall", 3, count=6)
    assert s.work_size == 12 and s.input_range(2) == (0, 6) and s.output_range(2) == (6, 12)
    assert [tuple(b) for b in output_blocks("alltoall", 3, 6, 1, None)] == [(0, 2, (0,), 2), (2, 2, (1,), 2),
                                                                           (4, 2, (2,), 2)]
    counts = np.array([[1, 2], [3, 0]])
    v = build("pairwise", "alltoallv", 2, counts=counts)
    assert v.count == 3 and v.input_count(1) == 3 and v.output_count_of(0) == 4 and v.output_count_of(1) == 2
    assert v.input_range(0) == (0, 3) and v.output_range(1) == (3, 5)
    # rank 1's output: block 0 (2 elements: rank 0's input elements [1, 3)), block 1 (empty)
    assert [tuple(b) for b in output_blocks("alltoallv", 2, 3, 1, None, counts)] == [(0, 2, (0,), 1), (2, 0, (1,), 3)]


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="alltoall count is each rank's input .p\\*k elements. and must divide by "
                                         "world_size=3; got count=7"):
        build("pairwise", "alltoall", 3, count=7)
    with pytest.raises(ValueError, match="alltoallv needs counts="):
        build("bruck", "alltoallv", 2)
    with pytest.raises(ValueError, match="must be a 2 x 2 matrix of integers"):
        build("bruck", "alltoallv", 2, counts=[[1, 2, 3]])
    with pytest.raises(ValueError, match="must be >= 0, got counts\\[1, 0\\] = -1"):
        build("bruck", "alltoallv", 2, counts=[[1, 1], [-1, 1]])
    with pytest.raises(ValueError, match="counts is for alltoallv only"):
        Schedule("x", "alltoall", 2, 2, [], counts=np.ones((2, 2), int))
    with pytest.raises(ValueError, match="algorithm 'hierarchical_alltoall' needs a topology"):
        build("hierarchical_alltoall", "alltoall", 2, count=2)


def test_bruck_takes_ceil_lg_p_rounds_and_several_messages_per_round():
    for p in (2, 5, 8, 12):
        s = build("bruck", "alltoall", p, count=p)
        prog = s.program(1)
        rounds = np.unique(prog.round[prog.peer != 1])
        assert rounds.size == (p - 1).bit_length()
        # round k moves every position with bit k set: several slots to one peer in one round
        k = rounds.size - 1
        assert (prog.round == rounds[0]).sum() == 2 * sum(1 for i in range(1, p) if i & 1)
        assert (np.unique(prog.peer[prog.round == rounds[k]]).size <= 2)


def test_event_simulated_on_a_cluster():
    topo = preset("dgx-h100", nodes=2)  # 2 domains of 8 GPUs
    p, count = topo.world_size, topo.world_size * 4096
    res = {name: simulate(build(name, "alltoall", p, count=count, topology=topo), topo, mode="event")
           for name in ("pairwise", "bruck", "hierarchical_alltoall")}
    for r in res.values():
        assert r.time > 0 and r.mode == "event"
    # every block between the domains crosses the NICs once in pairwise and hierarchical; Bruck forwards
    # blocks several times
    half = count * 4 * p // 2  # bytes leaving each domain
    assert res["pairwise"].tier_bytes["nic"] == pytest.approx(2 * half)
    assert res["hierarchical_alltoall"].tier_bytes["nic"] == pytest.approx(2 * half)
    assert res["bruck"].tier_bytes["nic"] > 2 * half
    # aggregation: one message per domain pair and rail instead of one per rank pair: faster here
    assert res["hierarchical_alltoall"].time < res["pairwise"].time


def test_programs_cost_their_own_operations():
    s = build("pairwise", "alltoall", 4096, count=4096)
    prog = s.program(17)
    assert len(prog) == 2 * 4096  # p - 1 sends, p - 1 receives, and the local copy's two ends
    assert (prog.remote[prog.peer == 17] != prog.start[prog.peer == 17]).all()
