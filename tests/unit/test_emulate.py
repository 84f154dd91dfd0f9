"""The emulator against numpy: ring x collective x world size x count x dtype x op, and input validation.

Integers must come out bitwise equal to the numpy reference (wrapping arithmetic is associative, so any
reduction order gives the same bits). Floats must be bitwise identical on every rank and within a bound of the
exact (float64) result that grows with the number of roundings, p - 1, and the dtype's epsilon.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives import algorithms, emulate

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)]
FLOATS = [np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64)]
DTYPES = INTS + FLOATS
OPS = ("sum", "prod", "min", "max", "avg")
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
UFUNC = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def eps(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps) if dtype == BFLOAT16 else float(np.finfo(dtype).eps)


def make_inputs(rng: np.random.Generator, dtype: np.dtype, op: str, p: int, n: int) -> list[np.ndarray]:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return [rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True) for _ in range(p)]
    if op == "prod":  # magnitudes near 1 keep a 33-way float16 product in range
        mag = rng.uniform(0.8, 1.25, size=(p, n))
        x = mag * rng.choice([-1.0, 1.0], size=(p, n))
    else:
        x = rng.uniform(-1.0, 1.0, size=(p, n)) * rng.choice([1.0, 64.0], size=(p, 1))
    return [row.astype(dtype) for row in x]


def count_for(collective: str, p: int, size: int) -> int:
    """A count in 0..3p+5 valid for `collective` (reduce_scatter: a multiple of p)."""
    return (size // p) * p if collective == "reduce_scatter" else size


def reference_blocks(collective: str, p: int, count: int, rank: int) -> slice:
    if collective == "reduce_scatter":
        k = count // p
        return slice(rank * k, (rank + 1) * k)
    return slice(0, count)


def check(collective: str, p: int, count: int, dtype: np.dtype, op: str, seed: int, chunks: int = 1) -> None:
    rng = np.random.default_rng(seed)
    inputs = make_inputs(rng, dtype, op, p, count)
    schedule = algorithms.build("ring", collective=collective, world_size=p, count=count, chunks=chunks)
    outputs = emulate(schedule, [x.copy() for x in inputs], op=op)
    assert len(outputs) == p
    if collective == "allgather":
        want = np.concatenate(inputs) if inputs else np.zeros(0, dtype)
        for r, out in enumerate(outputs):
            assert out.dtype == dtype and out.shape == (p * count,)
            assert out.tobytes() == want.tobytes(), f"rank {r}"
        return
    for x in inputs:  # the emulator must not write into the caller's arrays
        assert x.dtype == dtype
    outs = [np.asarray(o) for o in outputs]
    for r, out in enumerate(outs):
        assert out.dtype == dtype and out.shape == (schedule.output_count,), f"rank {r}"
    if collective == "allreduce":  # every rank holds the same bits
        for r, out in enumerate(outs[1:], 1):
            assert out.tobytes() == outs[0].tobytes(), f"rank {r} differs from rank 0 in bits"
    if dtype.kind in "iu" or op in ("min", "max"):
        # exact: wrapping integer arithmetic, and min/max never round
        if dtype == BFLOAT16:
            wide = [x.astype(np.float32) for x in inputs]
            want = functools.reduce(UFUNC[op], wide).astype(dtype) if inputs else None
        else:
            with np.errstate(over="ignore"):
                want = functools.reduce(UFUNC[op], inputs)
        for r, out in enumerate(outs):
            assert out.tobytes() == want[reference_blocks(collective, p, count, r)].tobytes(), f"rank {r}"
        return
    x64 = np.stack([x.astype(np.float64) for x in inputs])
    e = eps(dtype)
    if op == "prod":
        exact = np.prod(x64, axis=0)
        bound = 2 * p * e * np.abs(exact)
    else:
        exact = x64.sum(axis=0)
        bound = p * e * np.abs(x64).sum(axis=0)  # p - 1 roundings of partial sums, with room to spare
        if op == "avg":
            exact = exact / p
            bound = bound / p + 2 * e * np.abs(exact)
    for r, out in enumerate(outs):
        blk = reference_blocks(collective, p, count, r)
        got = out.astype(np.float64)
        err = np.abs(got - exact[blk])
        assert np.all(err <= bound[blk]), (
            f"rank {r}: max error {err.max()} exceeds the bound {bound[blk][np.argmax(err - bound[blk])]}")


@settings(max_examples=150, deadline=None)
@given(collective=st.sampled_from(COLLECTIVES), p=st.integers(1, 33), size=st.data(),
       dtype=st.sampled_from(DTYPES), op=st.sampled_from(OPS), chunks=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_ring_matches_numpy(collective, p, size, dtype, op, chunks, seed):
    if op == "avg" and dtype.kind in "iu":
        op = "sum"  # avg on integers is rejected; see test_avg_on_integers_is_rejected
    count = count_for(collective, p, size.draw(st.integers(0, 3 * p + 5), label="size"))
    check(collective, p, count, dtype, op, seed, chunks)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_every_dtype_and_op(dtype, op):
    if op == "avg" and dtype.kind in "iu":
        pytest.skip("avg needs a float dtype")
    for collective in ("allreduce", "reduce_scatter"):
        check(collective, 7, 7 * 3, dtype, op, seed=DTYPES.index(dtype) * 10 + OPS.index(op))


@pytest.mark.parametrize("p", range(1, 34))
def test_every_world_size_edge_counts(p):
    for count in sorted({0, 1, max(p - 1, 0), p, 3 * p + 5}):
        check("allreduce", p, count, np.dtype(np.int32), "sum", seed=p * 1000 + count)
        check("allgather", p, count, np.dtype(np.uint8), "sum", seed=p)
    for k in (0, 1, 3):
        check("reduce_scatter", p, p * k, np.dtype(np.float32), "sum", seed=p + k)


def test_avg_divides_once():
    # sum of p ones is exactly p; avg must give exactly 1.0 at every width
    for dtype in FLOATS:
        p = 13
        s = algorithms.build("ring", collective="allreduce", world_size=p, count=5)
        outs = emulate(s, [np.ones(5, dtype) for _ in range(p)], op="avg")
        assert all((o.astype(np.float64) == 1.0).all() for o in outs)


def test_float16_rounds_once_per_hop():
    # 2048 + 1 + 1 in float16: rounding each hop loses both ones; the result must still be within the bound
    p = 3
    s = algorithms.build("ring", collective="allreduce", world_size=p, count=1)
    outs = emulate(s, [np.array([2048], np.float16), np.array([1], np.float16), np.array([1], np.float16)])
    assert abs(float(outs[0][0]) - 2050.0) <= p * eps(np.dtype(np.float16)) * 2050
    assert len({o.tobytes() for o in outs}) == 1


def test_inputs_are_not_modified():
    p = 4
    xs = [np.arange(8, dtype=np.float64) + r for r in range(p)]
    before = [x.copy() for x in xs]
    emulate(algorithms.build("ring", collective="allreduce", world_size=p, count=8), xs)
    for x, b in zip(xs, before, strict=True):
        np.testing.assert_array_equal(x, b)


# -- input validation --------------------------------------------------------------------------------------

@pytest.fixture
def ring4():
    return algorithms.build("ring", collective="allreduce", world_size=4, count=6)


def test_wrong_number_of_inputs(ring4):
    with pytest.raises(ValueError, match=r"one input array per rank: world_size=4, got 3 inputs"):
        emulate(ring4, [np.zeros(6, np.float32)] * 3)


def test_wrong_input_size(ring4):
    xs = [np.zeros(6, np.float32)] * 3 + [np.zeros(5, np.float32)]
    with pytest.raises(ValueError, match=r"rank 3's input has 5 elements; this schedule was built for count=6"):
        emulate(ring4, xs)


def test_mixed_dtypes(ring4):
    xs = [np.zeros(6, np.float32)] * 2 + [np.zeros(6, np.float64)] * 2
    with pytest.raises(TypeError, match=r"rank 2's input has dtype float64, rank 0's has float32"):
        emulate(ring4, xs)


@pytest.mark.parametrize("dtype", [np.complex64, np.bool_, np.float128 if hasattr(np, "float128") else np.object_])
def test_unsupported_dtype(ring4, dtype):
    with pytest.raises(TypeError, match=r"unsupported dtype .*; supported: float16, bfloat16, float32"):
        emulate(ring4, [np.zeros(6, dtype)] * 4)


def test_unknown_op(ring4):
    with pytest.raises(ValueError, match=r"unknown reduction op 'mean'; valid ops: sum, prod, min, max, avg"):
        emulate(ring4, [np.zeros(6, np.float32)] * 4, op="mean")


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_avg_on_integers_is_rejected(ring4, dtype):
    with pytest.raises(ValueError, match=rf"op 'avg' needs a floating-point dtype, got {dtype.name}"):
        emulate(ring4, [np.zeros(6, dtype)] * 4, op="avg")


def test_allgather_ignores_op():
    # allgather moves data without reducing: any valid op name is accepted and ignored
    s = algorithms.build("ring", collective="allgather", world_size=3, count=2)
    outs = emulate(s, [np.full(2, r, np.int16) for r in range(3)], op="max")
    assert all(o.tolist() == [0, 0, 1, 1, 2, 2] for o in outs)
