"""The flat algorithms (binomial, double_binary_tree, recursive_doubling, rabenseifner, chain) against numpy.

Every drawn case builds a schedule, proves it with `verify`, runs it through `emulate` and compares each rank's
output with a numpy reference: integers bitwise (wrapping arithmetic is associative), floats within a rounding
bound of the float64 reference, with every rank of an allreduce holding the same bits. Each schedule's round
patterns are also evaluated the way the analytic simulator does (all members at once) and compared with the
per-node programs, and the message totals of all programs must balance.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives import algorithms, emulate, verify
from collectives.schedule import OpKind, Schedule
from collectives.schedule.phase import evaluate_slot

FLAT = ("binomial", "double_binary_tree", "recursive_doubling", "rabenseifner", "chain")
PIPELINED = ("binomial", "double_binary_tree", "chain")  # take a `chunks` parameter
CASES = [(name, coll) for name in FLAT for coll in algorithms.info(name).collectives]
DTYPES = ("int32", "int64", "float32", "float64", "float16")
OPS = ("sum", "prod", "min", "max")
FOLD = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def build(name: str, coll: str, p: int, count: int, root: int | None = None, chunks: int = 1) -> Schedule:
    params = {"chunks": chunks} if name in PIPELINED else {}
    return algorithms.build(name, collective=coll, world_size=p, count=count, root=root, **params)


def make_inputs(rng: np.random.Generator, p: int, count: int, dtype: str, op: str) -> list[np.ndarray]:
    if np.dtype(dtype).kind == "i":
        return [rng.integers(-1000, 1000, count).astype(dtype) for _ in range(p)]
    if op == "prod":  # magnitudes near 1 so that 33 factors stay inside float16's range
        return [(rng.uniform(0.8, 1.25, count) * rng.choice([-1.0, 1.0], count)).astype(dtype) for _ in range(p)]
    return [rng.uniform(-1.0, 1.0, count).astype(dtype) for _ in range(p)]


def expected(coll: str, p: int, count: int, root: int | None, xs: list[np.ndarray], op: str):
    """Per-rank reference outputs (None: no output) and, for reductions, the float error scale per element."""
    if coll == "broadcast":
        return [xs[root]] * p, None
    if coll == "allgather":
        return [np.concatenate(xs)] * p, None
    is_float = xs[0].dtype.kind == "f"
    acc = [x.astype(np.float64) for x in xs] if is_float else xs
    red = acc[0].copy()
    for x in acc[1:]:
        red = FOLD[op](red, x)
    scale = None
    if is_float:
        scale = np.sum(np.abs(np.stack(acc)), axis=0) if op == "sum" else np.abs(red)
        if op in ("min", "max"):
            scale = np.zeros_like(red)  # min and max are exact
    if coll == "allreduce":
        return [red] * p, [scale] * p
    if coll == "reduce":
        return [red if r == root else None for r in range(p)], [scale if r == root else None for r in range(p)]
    k = count // p  # reduce_scatter: rank r's block
    return ([red[r * k:(r + 1) * k] for r in range(p)],
            [None if scale is None else scale[r * k:(r + 1) * k] for r in range(p)])


def check_outputs(coll: str, p: int, count: int, root, xs, op: str, outputs) -> None:
    want, scales = expected(coll, p, count, root, xs, op)
    dtype = xs[0].dtype
    for r in range(p):
        if want[r] is None:
            assert outputs[r] is None, f"rank {r} has no output in {coll} but got one"
            continue
        got = outputs[r]
        assert got is not None and got.dtype == dtype and got.shape == want[r].shape, f"rank {r}: {got!r}"
        if scales is None or dtype.kind == "i":
            assert np.array_equal(got, want[r]), f"rank {r}: got {got}, want {want[r]}"
        else:
            # each reduction call rounds once; at most p calls touch an element on its way to rank r
            tol = (p + 1) * np.finfo(dtype).eps * scales[r]
            err = np.abs(got.astype(np.float64) - want[r])
            assert (err <= tol).all(), f"rank {r}: got {got}, want {want[r]} (error {err.max()} > tolerance)"
    if coll == "allreduce":
        first = outputs[0].tobytes()
        assert all(o.tobytes() == first for o in outputs), "allreduce ranks disagree bitwise"


def check_programs(s: Schedule) -> None:
    """Per-node programs balance, and all-members round evaluation agrees with the per-node programs."""
    sends, recvs = {}, {}
    for node in range(s.num_nodes):
        for o in s.program(node):
            key = (node, o.peer, o.round, o.start, o.stop) if o.kind == OpKind.SEND else \
                (o.peer, node, o.round, o.start, o.stop)
            book = sends if o.kind == OpKind.SEND else recvs
            book[key] = book.get(key, 0) + 1
    assert sends == recvs, "sends and receives across all programs do not pair up"
    # the analytic simulator's view: one call per (round pattern, iteration) with every member at once
    vectorized: dict[int, list[tuple[int, ...]]] = {}
    base = 0
    for phase in s.phases:
        m = np.arange(phase.group_size)
        for g, members in enumerate(phase.groups):
            b = base
            for rnd in phase.rounds:
                first_peers = None
                for it in range(rnd.repeats):
                    peers = []
                    for slot in rnd.slots(m, it):
                        peer, chunk, n = evaluate_slot(slot, m.shape)
                        peers.append(peer)
                        on = (peer >= 0) & (members >= 0)
                        start, stop = phase.chunks.elements(g, chunk[on], chunk[on] + n[on])
                        for row in zip(members[on].tolist(), members[peer[on]].tolist(), start.tolist(),
                                       stop.tolist(), strict=True):
                            vectorized.setdefault(row[0], []).append((b + it, int(slot.kind), *row[1:]))
                    # our uniform rounds (pipeline steady states) repeat one pattern of peers exactly
                    first_peers = peers if first_peers is None else first_peers
                    if rnd.uniform:
                        assert all(np.array_equal(x, y) for x, y in zip(peers, first_peers, strict=True)), rnd.name
                b += rnd.repeats
        base += phase.num_rounds
    for node in range(s.num_nodes):
        prog = s.program(node)
        want = list(zip(prog.round.tolist(), prog.kind.tolist(), prog.peer.tolist(), prog.start.tolist(),
                        prog.stop.tolist(), strict=True))
        assert vectorized.get(node, []) == want, f"node {node}: all-members evaluation differs from program()"


@st.composite
def case(draw, name: str):
    coll = draw(st.sampled_from([c for n, c in CASES if n == name]))
    p = draw(st.integers(1, 33))
    if coll == "reduce_scatter":
        count = p * draw(st.integers(0, 3))
    else:
        count = draw(st.integers(0, 3 * p + 5))
    root = draw(st.integers(0, p - 1)) if coll in ("broadcast", "reduce") else None
    chunks = draw(st.integers(1, 4)) if name in PIPELINED else 1
    dtype = draw(st.sampled_from(DTYPES))
    op = draw(st.sampled_from(OPS)) if coll in ("allreduce", "reduce", "reduce_scatter") else "sum"
    seed = draw(st.integers(0, 2**32 - 1))
    return coll, p, count, root, chunks, dtype, op, seed


@pytest.mark.parametrize("name", FLAT)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_against_numpy(name, data):
    coll, p, count, root, chunks, dtype, op, seed = data.draw(case(name))
    s = build(name, coll, p, count, root, chunks)
    verify(s, itemsize=np.dtype(dtype).itemsize)
    xs = make_inputs(np.random.default_rng(seed), p, count, dtype, op)
    check_outputs(coll, p, count, root, xs, op, emulate(s, xs, op))


@pytest.mark.parametrize("name,coll", CASES)
def test_every_world_size(name, coll):
    """Each world size 1..33 once (every power-of-two and fold shape), with counts below and above p."""
    rng = np.random.default_rng(7)
    for p in range(1, 34):
        for count in ((p - 1, 2 * p + 3) if coll != "reduce_scatter" else (0, 2 * p)):
            root = (5 * p + 3) % p if coll in ("broadcast", "reduce") else None
            s = build(name, coll, p, count, root, chunks=3)
            verify(s)
            xs = make_inputs(rng, p, count, "int64", "sum")
            check_outputs(coll, p, count, root, xs, "sum", emulate(s, xs, "sum"))
            if p in (1, 2, 6, 13):
                check_programs(s)


@pytest.mark.parametrize("name,coll", CASES)
@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 20), extra=st.integers(0, 7), chunks=st.integers(1, 3), data=st.data())
def test_round_patterns_vectorize(name, coll, p, extra, chunks, data):
    count = p * extra if coll == "reduce_scatter" else extra
    root = data.draw(st.integers(0, p - 1)) if coll in ("broadcast", "reduce") else None
    check_programs(build(name, coll, p, count, root, chunks))


def nccl_btree(n: int, rank: int) -> tuple[int, list[int]]:
    """ncclGetBtree (src/graph/trees.cc) transliterated: (parent, children)."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= n:
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, [d for d in (down0, down1) if d >= 0]


def test_double_binary_tree_is_nccls():
    from collectives.algorithms.double_binary_tree import double_binary_tree

    for n in list(range(1, 130)) + [255, 256, 257, 1000]:
        t0, t1 = double_binary_tree(n)
        for r in range(n):
            up, down = nccl_btree(n, r)
            assert t0.parent[r] == up and sorted(down) == sorted(c for c in t0.children[r] if c >= 0), (n, r)
            if n % 2:  # tree 1 shifts tree 0 by one rank
                up, down = nccl_btree(n, (r - 1) % n)
                up, down = (-1 if up < 0 else (up + 1) % n), [(d + 1) % n for d in down]
            else:  # tree 1 mirrors tree 0
                up, down = nccl_btree(n, n - 1 - r)
                up, down = (-1 if up < 0 else n - 1 - up), [n - 1 - d for d in down]
            assert t1.parent[r] == up and sorted(down) == sorted(c for c in t1.children[r] if c >= 0), (n, r)


@pytest.mark.parametrize("p", [2, 3, 5, 8, 12, 16, 17])
def test_costs_match_closed_forms(p):
    """Steps and per-rank bytes agree with models.md's formulas (n = count elements of 8 bytes)."""
    core = 1 << (p.bit_length() - 1)
    lg, folded = core.bit_length() - 1, int(core != p)
    n = 8 * core * 3  # divisible by the core size so that blocks are equal
    rd = verify(build("recursive_doubling", "allreduce", p, n), itemsize=8)
    assert rd.steps == lg + 2 * folded
    rab = verify(build("rabenseifner", "allreduce", p, n), itemsize=8)
    assert rab.steps == 2 * lg + 2 * folded
    assert rab.max_bytes_sent_per_rank == 8 * (2 * (core - 1) * n // core + folded * n)
    rs = verify(build("rabenseifner", "reduce_scatter", p, p * 5), itemsize=8)
    assert rs.steps == lg + 2 * folded
    assert verify(build("binomial", "reduce", p, n, root=p - 1)).steps == (p - 1).bit_length()
    assert verify(build("binomial", "broadcast", p, n, root=1)).steps == (p - 1).bit_length()
    assert verify(build("chain", "broadcast", p, n, root=0, chunks=4)).steps == p - 2 + 4


def test_parameter_errors():
    with pytest.raises(ValueError, match="chunks"):
        build("binomial", "allreduce", 4, 8, chunks=0)
    with pytest.raises(ValueError, match="chunks"):
        build("chain", "broadcast", 4, 8, root=0, chunks=1.5)
    with pytest.raises(ValueError, match="chunks"):
        build("double_binary_tree", "allreduce", 4, 8, chunks=-2)
    with pytest.raises(ValueError, match="chunks"):
        build("binomial", "reduce", 4, 8, root=1, chunks="2")
    with pytest.raises((TypeError, ValueError), match="chunks"):  # recursive doubling has no segments
        algorithms.build("recursive_doubling", collective="allreduce", world_size=4, count=8, chunks=2)
    with pytest.raises(ValueError, match="does not implement"):
        algorithms.build("double_binary_tree", collective="broadcast", world_size=4, count=8, root=0)


@pytest.mark.parametrize("name,size", [("dgx-h100", {"nodes": 1}), ("gb200-nvl72", {"racks": 1})])
def test_one_domain_tree_on_nccl_is_a_chain(name, size):
    """Inside a node NCCL's tree is a chain of the node's GPUs (src/graph/connect.cc, ncclTopoPreset): on one
    domain of a runtime cluster every channel's tree is a chain through all GPUs, the schedule is proved and
    runs bitwise; a host cluster (no runtime) keeps the two binary trees."""
    from collectives.algorithms.double_binary_tree import nccl_trees

    from collectives.topology import cluster, preset

    t = preset(name, **size)
    p = t.world_size
    for tree in nccl_trees(t, 4):
        assert int((tree.children >= 0).sum(axis=1).max()) == 1  # one child each: a chain
        assert int(tree.height.max()) == p - 1
    count = 3 * p + 1
    s = algorithms.build("double_binary_tree", collective="allreduce", world_size=p, count=count, topology=t,
                         chunks=2, channels=4)
    assert s.params["channels"] == 4
    verify(s, itemsize=8)
    rng = np.random.default_rng(5)
    xs = [rng.integers(-1000, 1000, count).astype(np.int64) for _ in range(p)]
    want = np.sum(xs, axis=0)
    assert all(np.array_equal(o, want) for o in emulate(s, xs))
    host = cluster(domains=1, gpus_per_domain=8, levels=0)
    assert host.runtime is None
    s = algorithms.build("double_binary_tree", collective="allreduce", world_size=8, count=9, topology=host)
    assert s.phases[0].name == "double binary tree"
