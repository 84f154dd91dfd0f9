"""In-network algorithms (nvls, sharp, hierarchical) against the verifier, the emulator and numpy.

verify() proves each schedule on clusters of 1..9 domains x 1..9 GPUs and on a full 72-GPU NVL72 domain;
emulate() runs the switches' reductions and must match numpy bitwise on integers; verify()'s per-node byte
counts show what the switches buy; every refusal reason falls back to a host algorithm with a note.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from collectives import algorithms, emulate, verify
from collectives.schedule import OpKind
from collectives.topology import cluster, preset

INTER = ("sharp", "ring", "double_binary_tree", "rabenseifner")
HIER = ("allreduce", "reduce_scatter", "allgather")


def topo(d: int, g: int, **kw):
    # radix 8 gives 2-level fabrics from 5 endpoints per rail up: trees with spines, shared by rails
    return cluster(domains=d, gpus_per_domain=g, radix=kw.pop("radix", 8), **kw)


def counts(coll: str, p: int) -> list[int]:
    return [0, p, 3 * p] if coll == "reduce_scatter" else [0, 1, 2 * p + 1]


def reference(coll: str, xs: list[np.ndarray], rank: int, root=None):
    p = len(xs)
    total = np.sum(xs, axis=0, dtype=xs[0].dtype) if xs[0].size else xs[0].copy()
    if coll == "allreduce":
        return total
    if coll == "reduce_scatter":
        k = xs[0].size // p
        return total[rank * k:(rank + 1) * k]
    if coll == "allgather":
        return np.concatenate(xs)
    if coll == "broadcast":
        return xs[root]
    return total if rank == root else None


def check(sched, coll: str, count: int, root=None, seed=0) -> None:
    """verify() and emulate() with int64 (exact, bitwise) on distinct inputs."""
    verify(sched, itemsize=8)
    rng = np.random.default_rng(seed)
    p = sched.world_size
    xs = [rng.integers(-1000, 1000, count).astype(np.int64) for _ in range(p)]
    out = emulate(sched, xs)
    for r, o in enumerate(out):
        ref = reference(coll, xs, r, root)
        if ref is None:
            assert o is None
        else:
            assert o is not None and o.dtype == ref.dtype and np.array_equal(o, ref), (sched.algorithm, coll, r)


def switch_ops(sched) -> dict[int, int]:
    """Switch node -> number of its operations."""
    return {n: len(sched.program(n)) for n in range(sched.world_size, sched.num_nodes) if len(sched.program(n))}


# -- correctness sweeps ------------------------------------------------------------------------------------------
SMALL = [(1, 1), (1, 4), (2, 1), (2, 3), (3, 2), (3, 5), (4, 4), (5, 3), (6, 1)]
LARGE = [(1, 9), (7, 2), (8, 3), (9, 9), (2, 8), (4, 6), (5, 7), (6, 5), (9, 1)]


@pytest.mark.parametrize("d,g", SMALL)
def test_every_builder_and_collective_small(d, g):
    t = topo(d, g)
    p = d * g
    if d == 1:
        for coll in HIER:
            for count in counts(coll, p):
                for chunks in (1, 3):
                    s = algorithms.build("nvls", collective=coll, world_size=p, count=count, topology=t,
                                         chunks=chunks)
                    assert not s.notes
                    check(s, coll, count)
    for coll in ("allreduce", "reduce", "broadcast"):
        root = None if coll == "allreduce" else p - 1
        for count in counts(coll, p):
            for result in ("multicast", "unicast"):
                s = algorithms.build("sharp", collective=coll, world_size=p, count=count, topology=t, root=root,
                                     result=result, chunks=2)
                assert bool(s.notes) == (d < 2)  # one domain: below sharp_min_nodes
                check(s, coll, count, root)
    for coll in HIER:
        for intra in ("nvls", "ring"):
            for inter in INTER:
                for count in counts(coll, p):
                    s = algorithms.build("hierarchical", collective=coll, world_size=p, count=count, topology=t,
                                         intra=intra, inter=inter, chunks=2 if count > p else 1)
                    check(s, coll, count)


@pytest.mark.parametrize("d,g", LARGE)
def test_default_builders_large(d, g):
    t = topo(d, g)
    p = d * g
    for coll in HIER:
        count = counts(coll, p)[-1]
        for intra, inter in (("nvls", "sharp"), ("ring", "rabenseifner")):
            s = algorithms.build("hierarchical", collective=coll, world_size=p, count=count, topology=t,
                                 intra=intra, inter=inter)
            assert not s.notes or d == 1 or coll != "allgather"
            check(s, coll, count)
    s = algorithms.build("sharp", collective="allreduce", world_size=p, count=p + 2, topology=t)
    check(s, "allreduce", p + 2)


def test_verify_every_shape_1_to_9():
    """The default hierarchical allreduce and flat sharp on every cluster of 1..9 domains x 1..9 GPUs."""
    for d in range(1, 10):
        for g in range(1, 10):
            t = topo(d, g)
            p = d * g
            for name in ("hierarchical", "sharp"):
                s = algorithms.build(name, collective="allreduce", world_size=p, count=p + 1, topology=t)
                verify(s)


def test_full_nvl72_domain():
    t = preset("gb300-nvl72", racks=1)
    p = t.world_size
    assert p == 72
    for coll in HIER:
        count = 2 * p if coll == "reduce_scatter" else p + 5
        for name, kw in (("nvls", {}), ("nvls", {"chunks": 4}), ("hierarchical", {})):
            s = algorithms.build(name, collective=coll, world_size=p, count=count, topology=t, **kw)
            assert not s.notes
            check(s, coll, count)
            assert switch_ops(s).keys() == {int(t.nvswitches()[0])}


# -- switches do the reductions ------------------------------------------------------------------------------
def test_switches_reduce_in_one_fused_round():
    t = topo(4, 3)
    s = algorithms.build("hierarchical", collective="allreduce", world_size=12, count=36, topology=t)
    ops = switch_ops(s)
    assert set(t.nvswitches().tolist()) <= set(ops)
    assert any(n >= t.nvswitch_base + t.num_domains for n in ops), "fabric switches take part"
    for n in ops:
        prog = s.program(n)
        for _, entries in prog.rounds():
            ranges = {}
            for _, o in entries:
                if o.kind != OpKind.SEND:
                    ranges.setdefault((o.start, o.stop), []).append(o.kind)
            for kinds in ranges.values():  # store then reduce-receives: one fused kernel call per range
                assert kinds[0] in (OpKind.RECV, OpKind.RECV_REDUCE)
                assert all(k == OpKind.RECV_REDUCE for k in kinds[1:])
    nvs = int(t.nvswitches()[0])
    kinds = [o.kind for o in s.program(nvs)]
    assert kinds.count(OpKind.RECV_REDUCE) >= 2  # the NVSwitch reduces the domain's 3 GPUs' copies
    assert s.node_labels[nvs] and all(n in s.node_labels for n in ops)
    assert [ph.name for ph in s.phases] == ["NVLS reduce-scatter + SHARP allreduce + NVLS allgather, pipelined"]


def test_float16_sum_identical_on_all_ranks():
    t = topo(3, 2)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(40).astype(np.float16) for _ in range(6)]
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for name, kw in (("sharp", {}), ("sharp", {"reproducible": False}), ("hierarchical", {})):
        s = algorithms.build(name, collective="allreduce", world_size=6, count=40, topology=t, dtype="float16",
                             **kw)
        out = emulate(s, xs)
        assert all(np.array_equal(o, out[0]) for o in out)  # the result comes down as one copy
        assert np.allclose(out[0].astype(np.float64), exact, atol=2e-2)
        assert s.params["accumulator_dtype"] == "float32"


# -- byte counts ---------------------------------------------------------------------------------------------
def per_gpu(name: str, t, count: int, **kw) -> tuple[float, float]:
    p = t.world_size
    s = algorithms.build(name, collective="allreduce", world_size=p, count=count, topology=t, **kw)
    rep = verify(s, itemsize=4)
    D = 4 * count
    return rep.bytes_sent[:p].max() / D, rep.bytes_received[:p].max() / D


def test_bytes_per_gpu():
    t = preset("gb300-nvl72", racks=1)
    n = 72
    assert per_gpu("nvls", t, 72 * 40) == pytest.approx((1 + 1 / n, 1 + 1 / n), rel=1e-3)
    assert per_gpu("ring", t, 72 * 40) == pytest.approx((2 * (n - 1) / n,) * 2, rel=1e-3)
    f = topo(8, 4)
    p = 32
    assert per_gpu("sharp", f, 640) == pytest.approx((1.0, 1.0))
    assert per_gpu("sharp", f, 640, result="unicast") == pytest.approx((1.0, 1.0))
    assert per_gpu("ring", f, 640) == pytest.approx((2 * (p - 1) / p,) * 2)
    sent, _ = per_gpu("hierarchical", f, 640)
    assert sent == pytest.approx(1 + 1 / 4 + 1 / 4)  # NVLS (1 + 1/G)·D + SHARP D/G


# -- refusals and fallbacks ----------------------------------------------------------------------------------
REFUSALS = [
    # (cluster overrides, build params, words the note must contain)
    ({"sharp": None}, {}, "no tree"),
    ({}, {"op": "prod"}, "does not offload op 'prod'"),
    ({}, {"op": "avg"}, "does not offload op 'avg'"),
    ({"sharp": "v2"}, {"dtype": "bfloat16"}, "does not offload dtype bfloat16"),
    ({"sharp": "v2"}, {"dtype": "int8"}, "does not offload dtype int8"),
    ({"domains": 1}, {}, "below the size threshold"),
    ({}, {"trees_in_use": 511}, "quota"),
    ({"sharp_sat_threshold": 0}, {"sat_lock": "denied"}, "SAT lock denied"),
]


@pytest.mark.parametrize("overrides,params,words", REFUSALS)
@pytest.mark.parametrize("name", ["sharp", "hierarchical"])
def test_sharp_refusals_fall_back(name, overrides, params, words, caplog):
    kw = {"domains": 3, "gpus_per_domain": 2, **overrides}
    t = topo(kw.pop("domains"), kw.pop("gpus_per_domain"), **kw)
    p = t.world_size
    with caplog.at_level(logging.WARNING, logger="collectives"):
        s = algorithms.build(name, collective="allreduce", world_size=p, count=2 * p + 1, topology=t, **params)
    if name == "hierarchical" and t.num_domains == 1:  # nothing crosses domains: no inter phase to refuse
        assert s.params["inter_used"] == "none (one domain)"
        check(s, "allreduce", 2 * p + 1)
        return
    assert any(words in n for n in s.notes), s.notes
    assert words in s.params["fallback_reason"]
    assert any(words in r.getMessage() for r in caplog.records)
    if name == "sharp":
        assert s.params["fallback"] == "ring" and s.algorithm == "sharp"
    if name == "hierarchical" and t.num_domains > 1 and "no tree" not in words:
        assert s.params["inter_used"] == "ring"
    dtype = params.get("dtype", "int64")
    if dtype == "int64":
        op = params.get("op", "sum")
        verify(s)
        xs = [np.arange(2 * p + 1, dtype=np.int64) % 5 + r for r in range(p)]
        fold = {"sum": np.add, "prod": np.multiply, "avg": np.add}[op]
        ref = fold.reduce(xs) if op != "avg" else None
        if op == "avg":
            xs = [x.astype(np.float64) for x in xs]
            ref = np.mean(xs, axis=0)
        out = emulate(s, xs, op=op)
        assert all(np.allclose(o, ref) if op == "avg" else np.array_equal(o, ref) for o in out)
    else:
        verify(s)


def test_sat_busy_and_limits_degrade_to_llt():
    t = topo(3, 2, sharp_sat_threshold=0)
    s = algorithms.build("sharp", collective="allreduce", world_size=6, count=20, topology=t)
    assert s.params["protocol"] == "sat" and not s.notes
    s = algorithms.build("sharp", collective="allreduce", world_size=6, count=20, topology=t, sat_lock="busy")
    assert s.params["protocol"] == "llt" and "SAT lock failed" in s.notes[0]
    check(s, "allreduce", 20)
    # SHARPv2: one active SAT tree per switch, and the rails' trees share the single switch
    t = topo(3, 2, sharp="v2", sharp_sat_threshold=0)
    s = algorithms.build("hierarchical", collective="allreduce", world_size=6, count=20, topology=t)
    assert s.params["sharp_protocol"] == "llt" and any("SAT limit" in n for n in s.notes)
    check(s, "allreduce", 20)


def test_llt_chunks_respect_the_ost_quota():
    t = topo(3, 2, sharp_ost_quota=4, sharp_sat_threshold=1 << 20)
    s = algorithms.build("sharp", collective="allreduce", world_size=6, count=4096, topology=t)
    prm = s.params
    assert prm["protocol"] == "llt" and prm["osts"] == 16  # 16 KiB in 1 KiB OSTs
    stages = 2 * prm["tree_depth"]
    assert prm["osts_per_chunk"] * stages <= 4 and prm["chunks"] * prm["osts_per_chunk"] >= prm["osts"]
    check(s, "allreduce", 4096)


@pytest.mark.parametrize("params,words", [({"op": "prod"}, "NVLS does not offload op 'prod'"),
                                          ({"dtype": "int8"}, "NVLS does not offload sum on int8")])
def test_nvls_refusals_fall_back(params, words, caplog):
    for name, t in (("nvls", topo(1, 5)), ("hierarchical", topo(2, 3))):
        p = t.world_size
        with caplog.at_level(logging.WARNING, logger="collectives"):
            s = algorithms.build(name, collective="allreduce", world_size=p, count=2 * p, topology=t, **params)
        assert any(words in n for n in s.notes) and words in s.params["fallback_reason"]
        assert any(words in r.getMessage() for r in caplog.records)
        verify(s)
    t = topo(1, 4, nvls=False)
    s = algorithms.build("nvls", collective="reduce_scatter", world_size=4, count=8, topology=t)
    assert "no NVLS" in s.notes[0]
    check(s, "reduce_scatter", 8)


def test_errors_are_clear():
    t = topo(2, 3)
    with pytest.raises(ValueError, match="hierarchical"):
        algorithms.build("nvls", collective="allreduce", world_size=6, count=6, topology=t)
    with pytest.raises(ValueError, match="world_size=5"):
        algorithms.build("sharp", collective="allreduce", world_size=5, count=6, topology=t)
    with pytest.raises(ValueError, match="intra must be one of"):
        algorithms.build("hierarchical", collective="allreduce", world_size=6, count=6, topology=t, intra="x")
    with pytest.raises(ValueError, match="needs a topology"):
        algorithms.build("sharp", collective="allreduce", world_size=6, count=6)


@pytest.mark.parametrize("name", ["hierarchical", "nvls", "sharp"])
def test_fully_connected_is_a_clear_value_error(name):
    """A topology without scale-up domains or switches (fully_connected) is refused with a ValueError that says
    what is missing, not an AttributeError from deep inside the builder."""
    from collectives.topology import fully_connected

    with pytest.raises(ValueError, match=r"scale-up domains.*fully-connected.*num_domains"):
        algorithms.build(name, collective="allreduce", world_size=8, count=16, topology=fully_connected(8))


def test_trees_sharing_switches_kept_per_list():
    """_innetwork._share_switches (SAT's one-tree-per-switch limit) is kept per trees list: another list on the
    same cluster gets its own answer."""
    from collectives.algorithms._innetwork import _share_switches

    topo = preset("gb200-nvl72", racks=4, gpus_per_domain=4)
    tree = topo.sharp_tree()
    twice, once = [tree, tree], [tree]
    assert _share_switches(topo, twice) and _share_switches(topo, twice)
    assert not _share_switches(topo, once)
