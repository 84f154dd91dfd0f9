"""Fuzzing the schedule builders (issue 9): hypothesis draws world sizes, chunk counts, topology shapes and
roots; every schedule must pass the verifier, and a small int64 emulation must give the exact result."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectives import algorithms, emulate, verify
from collectives.topology import cluster

FLAT = {
    "ring": ("allreduce", "reduce_scatter", "allgather"),
    "binomial": ("allreduce", "broadcast", "reduce"),
    "chain": ("allreduce", "broadcast", "reduce"),
    "double_binary_tree": ("allreduce",),
    "rabenseifner": ("allreduce", "reduce_scatter"),
    "recursive_doubling": ("allreduce", "allgather"),
    "direct": ("allreduce", "reduce_scatter", "reduce"),
    "one_shot": ("allreduce",),
}
CHUNKED = {"ring", "binomial", "chain", "double_binary_tree", "direct", "one_shot"}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def count_for(collective: str, p: int, k: int) -> int:
    return p * k if collective == "reduce_scatter" else k


def exact(collective: str, xs: list[np.ndarray], rank: int, root):
    p = len(xs)
    total = np.sum(xs, axis=0) if xs[0].size else xs[0].copy()
    if collective == "allreduce":
        return total
    if collective == "reduce_scatter":
        k = xs[0].size // p
        return total[rank * k:(rank + 1) * k]
    if collective == "allgather":
        return np.concatenate(xs)
    if collective == "broadcast":
        return xs[root]
    return total if rank == root else None


def check(sched, collective: str, count: int, root, seed: int) -> None:
    verify(sched, itemsize=8)
    if sched.world_size > 24:
        return
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-1000, 1000, count).astype(np.int64) for _ in range(sched.world_size)]
    for r, o in enumerate(emulate(sched, xs)):
        want = exact(collective, xs, r, root)
        assert (o is None) if want is None else np.array_equal(o, want), (sched.algorithm, collective, r)


@FUZZ
@given(data=st.data(), name=st.sampled_from(sorted(FLAT)), p=st.integers(1, 40), k=st.integers(0, 9),
       chunks=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_flat_builders(data, name, p, k, chunks, seed):
    collective = data.draw(st.sampled_from(FLAT[name]))
    root = data.draw(st.integers(0, p - 1)) if collective in ("broadcast", "reduce") else None
    params = {"chunks": chunks} if name in CHUNKED else {}
    count = count_for(collective, p, k)
    sched = algorithms.build(name, collective=collective, world_size=p, count=count, root=root, **params)
    check(sched, collective, count, root, seed)


@FUZZ
@given(data=st.data(), domains=st.integers(1, 5), gpus=st.integers(1, 6), k=st.integers(0, 5),
       chunks=st.integers(1, 4), radix=st.sampled_from([4, 8, 16]), seed=st.integers(0, 2**16))
def test_innetwork_builders(data, domains, gpus, k, chunks, radix, seed):
    topo = cluster(domains=domains, gpus_per_domain=gpus, radix=radix)
    p = domains * gpus
    choices = ["sharp", "hierarchical"] + (["nvls"] if domains == 1 else [])
    name = data.draw(st.sampled_from(choices))
    if name == "sharp":
        collective = data.draw(st.sampled_from(["allreduce", "reduce", "broadcast"]))
        root = data.draw(st.integers(0, p - 1)) if collective != "allreduce" else None
        params = {"chunks": chunks, "result": data.draw(st.sampled_from(["multicast", "unicast"]))}
    elif name == "nvls":
        collective = data.draw(st.sampled_from(["allreduce", "reduce_scatter", "allgather"]))
        root, params = None, {"chunks": chunks}
    else:
        collective = data.draw(st.sampled_from(["allreduce", "reduce_scatter", "allgather"]))
        root = None
        params = {"chunks": chunks, "intra": data.draw(st.sampled_from(["nvls", "ring"])),
                  "inter": data.draw(st.sampled_from(["sharp", "ring", "double_binary_tree", "rabenseifner"]))}
    count = count_for(collective, p, k)
    sched = algorithms.build(name, collective=collective, world_size=p, count=count, root=root, topology=topo,
                             **params)
    check(sched, collective, count, root, seed)
