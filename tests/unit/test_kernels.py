"""collectives.kernels: every backend x dtype x op x input count, bitwise against a numpy reference."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from collectives import kernels
from collectives.kernels import (
    ARITHMETIC_OPS,
    BITWISE_OPS,
    SUPPORTED_DTYPES,
    SUPPORTED_OPS,
    _use_backend,
    ops_for,
    reduce_into,
    round_into,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
HALF = (F16, BF16)
UFUNC = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
         "bor": np.bitwise_or, "bxor": np.bitwise_xor}
INTEGERS = [d for d in SUPPORTED_DTYPES if d.kind in "iu"]
C_LOADED = kernels.backend_info()["c_loaded"]
BACKENDS = (["c", "c-portable"] if C_LOADED else []) + ["numba", "numpy"]


# ---------------------------------------------------------------------------------------------- helpers
@np.errstate(all="ignore")
def reference(inputs: list[np.ndarray], op: str, out_dtype: np.dtype) -> np.ndarray:
    """numpy's own fold, left to right; 16-bit floats widened to float32 and rounded once at the end."""
    if len(inputs) == 1 and inputs[0].dtype == out_dtype:
        return inputs[0].copy()
    if out_dtype in HALF or any(x.dtype in HALF for x in inputs):
        acc = functools.reduce(UFUNC[op], [x.astype(F32) for x in inputs])
        return acc.astype(out_dtype)
    return functools.reduce(UFUNC[op], inputs).astype(out_dtype)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.dtype.itemsize}")


def assert_same(got: np.ndarray, want: np.ndarray, exact_nan: bool = False) -> None:
    """Bitwise equal; NaN only has to be NaN where numpy's NaN is (payloads are not portable) unless exact."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind in "iu" or exact_nan:
        np.testing.assert_array_equal(bits(got), bits(want))
        return
    g32, w32 = got.astype(F32), want.astype(F32)
    gn, wn = np.isnan(g32), np.isnan(w32)
    np.testing.assert_array_equal(gn, wn)
    np.testing.assert_array_equal(bits(got)[~gn], bits(want)[~wn])


@pytest.fixture(params=BACKENDS)
def backend(request):
    name = request.param
    if name == "c-portable":
        from collectives.kernels import _c

        _c.force_portable(True)
        with _use_backend("c"):
            yield name
        _c.force_portable(False)
    else:
        with _use_backend(name):
            yield name


def random_inputs(rng: np.random.Generator, dtype: np.dtype, n_inputs: int, size: int,
                  special: bool = True) -> list[np.ndarray]:
    out = []
    for _ in range(n_inputs):
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            x = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        else:
            x = (rng.standard_normal(size) * rng.choice([1e-6, 1.0, 3.0, 1e3], size)).astype(dtype)
            if special and size:
                specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-8, 6e4], F32).astype(dtype)
                idx = rng.integers(0, size, max(1, size // 16))
                x[idx] = rng.choice(specials, idx.size)
        out.append(x)
    return out


# ---------------------------------------------------------------------------------------------- sweep
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=lambda d: "bfloat16" if d == BF16 else d.name)
@pytest.mark.parametrize("op", ARITHMETIC_OPS)
def test_every_dtype_op_and_count(backend, dtype, op):
    rng = np.random.default_rng(abs(hash((dtype.name, op))) % 2**32)
    size = 1003  # odd, spans vector tails
    pool = random_inputs(rng, dtype, 18, size)
    for n in list(range(1, 17)) + [18]:
        xs = pool[:n]
        out = np.empty(size, dtype)
        assert reduce_into(out, xs, op) is out
        assert_same(out, reference(xs, op, dtype), exact_nan=(op in ("min", "max") and dtype.itemsize >= 4))


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: d.name)
def test_bitwise_ops_every_integer_dtype(backend, dtype):
    """band/bor/bxor fold bit for bit like numpy's bitwise ufuncs, signed dtypes included (the kernels run them on
    the unsigned type of the same width), for 1..9 inputs (9: more than one pass) and odd sizes (vector tails)."""
    rng = np.random.default_rng(abs(hash((dtype.name, "bitwise"))) % 2**32)
    pool = random_inputs(rng, dtype, 9, 1003)
    for op in BITWISE_OPS:
        for n in (1, 2, 3, 8, 9):
            out = np.empty(1003, dtype)
            assert reduce_into(out, pool[:n], op) is out
            assert_same(out, reference(pool[:n], op, dtype))
        in_place = pool[0].copy()  # out is the first input
        reduce_into(in_place, [in_place, *pool[1:4]], op)
        assert_same(in_place, reference(pool[:4], op, dtype))
    # the identities the ops must keep: x & ~0 = x, x | 0 = x, x ^ x = 0
    x = pool[0]
    ones = np.full_like(x, -1 if dtype.kind == "i" else np.iinfo(dtype).max)
    assert_same(reduce_into(np.empty_like(x), [x, ones], "band"), x)
    assert_same(reduce_into(np.empty_like(x), [x, np.zeros_like(x)], "bor"), x)
    assert_same(reduce_into(np.empty_like(x), [x, x], "bxor"), np.zeros_like(x))


@pytest.mark.parametrize("dtype", [F16, BF16, F32, np.dtype(np.float64)], ids=lambda d: str(d))
def test_bitwise_ops_refuse_floats(backend, dtype):
    a = np.ones(4, dtype)
    for op in BITWISE_OPS:
        with pytest.raises(TypeError, match=f"op '{op}' is bitwise: it needs an integer dtype"):
            reduce_into(a, [a, a], op)
    assert ops_for(dtype) == ARITHMETIC_OPS
    assert ops_for(np.int32) == SUPPORTED_OPS


@pytest.mark.skipif(not C_LOADED, reason="C extension not built")
def test_c_kernel_refuses_bitwise_float_codes():
    """The plan runner calls coll_reduce with the op's code directly: a bitwise code on a float dtype is refused
    there too (-1), never run on float bits."""
    from collectives._ckernels import ffi, lib

    a = np.ones(4, F32)
    ptrs = ffi.new("void *[]", [ffi.from_buffer(a)])
    assert lib.coll_reduce(0, lib.COLL_BAND, ffi.from_buffer(a), ptrs, 1, 4) == -1
    assert lib.coll_reduce(0, lib.COLL_OPS, ffi.from_buffer(a), ptrs, 1, 4) == -1
    i = np.arange(4, dtype=np.int32)
    ptrs = ffi.new("void *[]", [ffi.from_buffer(i), ffi.from_buffer(i)])
    assert lib.coll_reduce(4, lib.COLL_BXOR, ffi.from_buffer(i), ptrs, 2, 4) == 0 and not i.any()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=lambda d: "bfloat16" if d == BF16 else d.name)
def test_out_is_first_input_and_large_counts(backend, dtype):
    rng = np.random.default_rng(1)
    for n, size in ((2, 70_001), (9, 20_003)):  # n = 9 exercises blocks of the accumulator
        xs = random_inputs(rng, dtype, n, size)
        want = reference(xs, "sum", dtype)
        reduce_into(xs[0], xs, "sum")
        assert_same(xs[0], want)


def test_float_sums_are_left_folds_not_reassociated(backend):
    # (1e8 + 1) - 1e8 == 0 in float32 but 1 if reassociated
    a, b, c = (np.full(33, v, F32) for v in (1e8, 1.0, -1e8))
    out = np.empty(33, F32)
    reduce_into(out, [a, b, c])
    assert_same(out, (a + b) + c)
    assert (out == 0).all()


def test_sixteen_bit_accumulates_in_float32_once(backend):
    # eight float16 ones plus 2048: float16 chained adds would stall at 2048, float32 accumulation does not
    xs = [np.full(17, 2048, F16)] + [np.ones(17, F16)] * 8
    out = np.empty(17, F16)
    reduce_into(out, xs)
    assert (out == 2056).all()


@pytest.mark.parametrize("half", HALF, ids=["float16", "bfloat16"])
def test_mixed_float32_accumulator(backend, half):
    rng = np.random.default_rng(2)
    acc = rng.standard_normal(1001).astype(F32)
    xs = [x for x in random_inputs(rng, half, 3, 1001)]
    for op in ARITHMETIC_OPS:
        out = acc.copy()
        reduce_into(out, [out, *xs], op)
        assert_same(out, reference([acc, *xs], op, F32))
    out = np.empty(1001, F32)
    reduce_into(out, [xs[0]])  # widening copy
    assert_same(out, xs[0].astype(F32))
    r = np.empty(1001, half)
    round_into(r, acc * 1e3)
    assert_same(r, (acc * 1e3).astype(half))


@pytest.mark.parametrize("half", HALF, ids=["float16", "bfloat16"])
def test_every_16bit_value_and_rounding(backend, half):
    everything = np.arange(2**16, dtype=np.uint16).view(half)
    out = np.empty_like(everything)
    reduce_into(out, [everything, everything], "max")
    assert_same(out, everything)
    rng = np.random.default_rng(3)
    f = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(F32)
    f = np.concatenate([f, (rng.standard_normal(100_000) * 1e-6).astype(F32)])  # subnormal results
    r = np.empty(f.size, half)
    round_into(r, f)
    with np.errstate(all="ignore"):
        assert_same(r, f.astype(half))


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(SUPPORTED_DTYPES),
    op=st.sampled_from(SUPPORTED_OPS),
    n=st.integers(1, 12),
    size=st.sampled_from([0, 1, 2, 7, 8, 9, 15, 17, 31, 1023, 1025]),
    offset=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_unaligned_views(dtype, op, n, size, offset, seed):
    assume(op in ops_for(dtype))
    rng = np.random.default_rng(seed)
    xs = [x[offset:offset + size] for x in random_inputs(rng, dtype, n, size + 4)]
    want = reference(xs, op, dtype)
    for name in BACKENDS:
        out_buf = np.zeros(size + 4, dtype)
        out = out_buf[offset:offset + size]  # a contiguous view at an odd address
        if name == "c-portable":
            from collectives.kernels import _c

            _c.force_portable(True)
            try:
                with _use_backend("c"):
                    reduce_into(out, xs, op)
            finally:
                _c.force_portable(False)
        else:
            with _use_backend(name):
                reduce_into(out, xs, op)
        assert_same(out, want)
        assert not bits(out_buf[:offset]).any() and not bits(out_buf[offset + size:]).any()


def test_arbitrary_shapes_are_flat_and_noncontiguous_inputs_copied():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 5)).astype(F32)
    b = rng.standard_normal((5, 6)).astype(F32).T  # F-ordered, same size
    out = np.empty(30, F32)
    reduce_into(out, [a, b])
    assert_same(out, a.ravel() + b.ravel())


def test_partially_overlapping_input_is_read_before_written():
    buf = np.arange(20, dtype=np.int32)
    want = buf[2:12] + buf[:10]
    reduce_into(buf[2:12], [buf[2:12], buf[:10]])
    np.testing.assert_array_equal(buf[2:12], want)


# ---------------------------------------------------------------------------------------------- errors
def test_validation_errors():
    a = np.ones(4, F32)
    with pytest.raises(ValueError, match="valid ops: sum, prod, min, max, band, bor, bxor"):
        reduce_into(a, [a], "mean")
    with pytest.raises(ValueError, match="empty inputs"):
        reduce_into(a, [])
    with pytest.raises(ValueError, match="5 elements.*out has 4"):
        reduce_into(a, [np.ones(5, F32)])
    with pytest.raises(TypeError, match="dtype float64 but out has float32"):
        reduce_into(a, [np.ones(4)])
    with pytest.raises(TypeError, match="bfloat16 but out has float16"):
        reduce_into(np.ones(4, F16), [np.ones(4, BF16)])
    with pytest.raises(TypeError, match="one 16-bit"):
        reduce_into(a, [np.ones(4, F16), np.ones(4, BF16)])
    with pytest.raises(TypeError, match="supported: float16, bfloat16, float32"):
        reduce_into(np.ones(4, np.complex64), [np.ones(4, np.complex64)])
    with pytest.raises(TypeError, match="supported"):
        reduce_into(np.ones(4, bool), [np.ones(4, bool)])
    ro = np.ones(4, F32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        reduce_into(ro, [a])
    with pytest.raises(ValueError, match="C-contiguous"):
        reduce_into(np.ones(8, F32)[::2], [a])
    with pytest.raises(TypeError, match="numpy.ndarray"):
        reduce_into(a, [[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(TypeError, match="float32"):
        round_into(np.ones(4, F16), np.ones(4))
    empty = np.empty(0, F32)
    assert reduce_into(empty, [empty, empty]) is empty


def test_supported_lists_and_backend_info():
    assert set(SUPPORTED_OPS) == {"sum", "prod", "min", "max", "band", "bor", "bxor"}
    assert len(SUPPORTED_DTYPES) == 12
    info = kernels.backend_info()
    assert set(info["backends"]) == {"bfloat16" if d == BF16 else d.name for d in SUPPORTED_DTYPES}
    if info["c_loaded"]:
        assert info["cpu_path"] in ("avx2+f16c", "portable scalar")


# ---------------------------------------------------------------------------------------------- fallback
def test_fallback_without_c_is_identical_and_warns_once(monkeypatch):
    monkeypatch.setattr(kernels, "_c", None)
    monkeypatch.setattr(kernels, "_c_error", "simulated: extension missing")
    monkeypatch.setattr(kernels, "_fallback_warned", False)
    rng = np.random.default_rng(5)
    with pytest.warns(RuntimeWarning, match="simulated: extension missing.*C compiler") as record:
        for dtype in SUPPORTED_DTYPES:
            xs = random_inputs(rng, dtype, 5, 777)
            out = np.empty(777, dtype)
            reduce_into(out, xs, "sum")
            assert_same(out, reference(xs, "sum", dtype))
    assert len([w for w in record if "C reduction kernels unavailable" in str(w.message)]) == 1
    assert kernels.backend_info()["c_loaded"] is False


def test_environment_variable_disables_c():
    code = (
        "import warnings, numpy as np\n"
        "from collectives import kernels\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    a = np.arange(10, dtype=np.int64)\n"
        "    kernels.reduce_into(a, [a, a]); kernels.reduce_into(a, [a, a])\n"
        "assert a.tolist() == [4 * i for i in range(10)], a\n"
        "assert not kernels.backend_info()['c_loaded']\n"
        "msgs = [str(x.message) for x in w if x.category is RuntimeWarning]\n"
        "assert len(msgs) == 1 and 'COLLECTIVES_NO_C_KERNELS' in msgs[0], msgs\n"
    )
    env = dict(os.environ, COLLECTIVES_NO_C_KERNELS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_no_warning_when_c_is_loaded():
    if not C_LOADED:
        pytest.skip("C extension not built")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = np.ones(3, F32)
        reduce_into(a, [a, a])


# -- threads: a large reduction split over threads gives the same bits ---------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int64])
def test_threaded_split_is_bitwise_equal(dtype, monkeypatch):
    from collectives.kernels import _parallel

    monkeypatch.setattr(_parallel, "MIN_SLICE_BYTES", 4096)  # split even this small array
    rng = np.random.default_rng(7)
    n = 3 * 4096 * 5 + 123  # not a multiple of the slice alignment: the last slice is short
    xs = [rng.standard_normal(n).astype(np.float32).astype(dtype) for _ in range(5)]
    previous = kernels.get_threads()
    try:
        kernels.set_threads(1)
        single = kernels.reduce_into(np.empty_like(xs[0]), xs)
        kernels.set_threads(3)
        split = kernels.reduce_into(np.empty_like(xs[0]), xs)
        in_place = xs[0].copy()
        kernels.reduce_into(in_place, [in_place, *xs[1:]])
    finally:
        kernels.set_threads(previous)
    assert single.view(np.uint8).tobytes() == split.view(np.uint8).tobytes()
    assert single.view(np.uint8).tobytes() == in_place.view(np.uint8).tobytes()


def test_set_threads_rejects_bad_values(monkeypatch):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive integer"):
            kernels.set_threads(bad)
    from collectives.kernels import _parallel

    monkeypatch.setenv("COLLECTIVES_KERNEL_THREADS", "zero")
    with pytest.raises(ValueError, match="COLLECTIVES_KERNEL_THREADS"):
        _parallel._default_threads()
    monkeypatch.setenv("COLLECTIVES_KERNEL_THREADS", "3")
    assert _parallel._default_threads() == 3
    assert kernels.backend_info()["threads"] == kernels.get_threads()
