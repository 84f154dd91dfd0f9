"""Reduction kernels: ``out = inputs[0] (op) inputs[1] (op) ...`` element-wise, in one fused pass.

This is where a received chunk gets reduced. Arrays are flat element sequences (C order); ``out`` may be
``inputs[0]`` itself (or any one input), and any number of inputs (>= 1) is folded in one call.

Semantics (every backend gives the same bits; NaN results may differ in payload between backends)
  - ops ``sum``, ``prod``, ``min``, ``max``, and for integer dtypes the bitwise ``band``, ``bor``, ``bxor``
    (on the unsigned type of the same width: the same bits for signed dtypes); float folds run strictly left to right in input order,
    bitwise equal to numpy's chained ``((a + b) + c) + ...`` and to ``functools.reduce(np.maximum, inputs)``
    (NaN propagates; on +0.0/-0.0 ties the later input wins, as in numpy).
  - integers wrap (two's complement), as numpy does.
  - float16 and bfloat16 are widened to float32, folded in float32 across *all* inputs of the call and
    rounded once to nearest-even; a single input is a plain copy.
  - accumulation: ``out`` may be float32 while the inputs are float32 and/or one 16-bit dtype (say
    ``reduce_into(acc32, [acc32, x16, y16])``): the float32 result is stored unrounded. `round_into`
    then rounds a float32 accumulator to float16/bfloat16 (nearest-even).

Backends (``backend_info()`` tells which one serves each dtype)
  ``c``     csrc/reduce.c via cffi (collectives._ckernels): AVX2/F16C code chosen at run time, portable
            scalar C otherwise. Releases the GIL.
  ``numba`` the same block-wise fold JIT-compiled (16-bit floats as uint16 bit patterns). Without the C
            extension it serves float16 only (numpy has no fast float16 arithmetic); elsewhere numpy
            measured faster (FALLBACK below).
  ``numpy`` ufuncs block by block: the other fallback, and the reference semantics.
  Without the C extension the package warns once (RuntimeWarning) and falls back. Set
  ``COLLECTIVES_NO_C_KERNELS=1`` to disable the C extension (read at import).

Threads: a call whose ``out`` holds 8 MiB or more is split into contiguous slices folded by several threads
(``set_threads``/``get_threads``, ``COLLECTIVES_KERNEL_THREADS``; default the CPUs available, at most 8; see
``_parallel``). One core is bound by the cache misses it keeps in flight, not by DRAM: ``bench_kernels.py``
float32 2-input in place 0.99x numpy on one thread, 1.07-1.59x on two; 8-input fused 1.54x vs 2.02-2.88x.
Same bits either way.

Why C serves every dtype: ``python bench/bench_kernels.py --sweep`` (4M elements per array, 2-core AMD
EPYC VM with AVX2/F16C/AVX-512, np.copyto ~31-37 GB/s). GB/s of reduce_into(out, inputs, "sum"),
reads + writes counted, 2 inputs / 8 inputs:

    dtype      c            numba      numpy
    float16    61.4 / 30.7  2.4 / 2.3  1.5 / 1.6
    bfloat16   35.6 / 28.3  5.7 / 4.6  7.6 / 7.4
    float32    48.4 / 34.9  4.9 / 5.2  34.1 / 28.1
    float64    47.1 / 36.9  7.5 / 6.5  40.1 / 30.8
    int8       68.2 / 43.0  2.8 / 2.7  52.5 / 24.7
    int32      49.9 / 38.8  5.2 / 5.4  43.3 / 28.0
    int64      42.1 / 33.3  6.8 / 6.6  36.1 / 25.5
    (int16/uint* alike: c first everywhere, numba last except for float16.)

C wins for every dtype, so PREFERRED is "c" throughout. Numba's fold (typed-List inputs, scalar loop)
stays far below numpy's SIMD ufuncs except for float16, where numpy converts element by element.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator, Sequence
from types import ModuleType

import numpy as np

from . import _numpy
from ._dtypes import (
    ARITHMETIC_OPS,
    BITWISE_OPS,
    FLOAT16,
    FLOAT32,
    HALF_CODES,
    NATIVE_CODES,
    OP_CODES,
    SUPPORTED_DTYPES,
    SUPPORTED_OPS,
    dtype_name,
    ops_for,
)
from ._parallel import get_threads, run_split, set_threads

__all__ = ["ARITHMETIC_OPS", "BITWISE_OPS", "SUPPORTED_DTYPES", "SUPPORTED_OPS", "backend_info", "c_kernel",
           "get_threads", "ops_for", "reduce_into", "round_into", "set_threads"]

BACKENDS = ("c", "numba", "numpy")
# Backend per dtype when the C extension is loaded, chosen by measurement (see the module docstring).
PREFERRED: dict[np.dtype, str] = {dt: "c" for dt in SUPPORTED_DTYPES}
# Backend per dtype without the C extension, also by measurement.
FALLBACK: dict[np.dtype, str] = {dt: "numba" if dt == FLOAT16 else "numpy" for dt in SUPPORTED_DTYPES}

_c: ModuleType | None = None
_c_error: str | None = None
_numba: ModuleType | None = None
_numba_error: str | None = None
_forced: str | None = None
_fallback_warned = False


def _load_c() -> None:
    global _c, _c_error
    try:
        _c = importlib.import_module("collectives.kernels._c")
        _c_error = None
    except ImportError as exc:  # extension not built, or disabled by COLLECTIVES_NO_C_KERNELS
        _c, _c_error = None, str(exc) or type(exc).__name__


def _load_numba() -> ModuleType | None:
    global _numba, _numba_error
    if _numba is None and _numba_error is None:
        try:
            _numba = importlib.import_module("collectives.kernels._numba")
        except ImportError as exc:
            _numba_error = str(exc)
    return _numba


_load_c()


def _warn_fallback() -> None:
    global _fallback_warned
    if not _fallback_warned:
        _fallback_warned = True
        warnings.warn(
            f"collectives: C reduction kernels unavailable ({_c_error}); using the slower Numba/numpy "
            "fallback (same results). To fix, reinstall with a C compiler available "
            "(pip install --force-reinstall --no-deps collectives) and unset COLLECTIVES_NO_C_KERNELS.",
            RuntimeWarning,
            stacklevel=3,
        )


def _backend(dtype: np.dtype, mixed: bool) -> ModuleType:
    """The module that runs this call: forced by a test, preferred by measurement, or a fallback."""
    name = _forced
    if name is None:
        if _c is not None:
            name = PREFERRED[dtype]
        else:
            _warn_fallback()
            name = FALLBACK[dtype]
    if name == "c":
        if _c is None:
            raise RuntimeError(f"C kernels requested but unavailable: {_c_error}")
        return _c
    if name == "numba" and not mixed and _load_numba() is not None:
        return _numba  # type: ignore[return-value]
    return _numpy  # numba does not do mixed float32/16-bit accumulation


@contextlib.contextmanager
def _use_backend(name: str | None) -> Iterator[None]:
    """Force one backend ("c", "numba", "numpy") for every dtype inside the block (tests, benchmarks)."""
    global _forced
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    previous, _forced = _forced, name
    try:
        yield
    finally:
        _forced = previous


def _check_out(out: object, name: str) -> np.ndarray:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"unsupported dtype {out.dtype} for {name}; supported: {_dtype_list()}")
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only; reductions write into it")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (reductions write it as one flat sequence)")
    return out


def _dtype_list() -> str:
    return ", ".join(dtype_name(dt) for dt in SUPPORTED_DTYPES)


def _prepare_input(x: np.ndarray, k: int, out: np.ndarray) -> np.ndarray:
    """Flat contiguous view of input k that the kernel may read while writing out."""
    if x.size != out.size:
        raise ValueError(
            f"inputs[{k}] has {x.size} elements (shape {x.shape}) but out has {out.size} (shape {out.shape}); "
            "arrays are reduced as flat element sequences and must all have out's size"
        )
    if x is out:  # out may be exactly one of the inputs (out is checked C-contiguous already)
        return x.reshape(-1)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    # The kernels allow out to be exactly one of the inputs; any other overlap would read elements
    # already overwritten, so such an input is copied first.
    if x.size and np.may_share_memory(x, out):
        same = x.dtype == out.dtype and x.__array_interface__["data"][0] == out.__array_interface__["data"][0]
        if not same:
            x = x.copy()
    return x.reshape(-1)


def reduce_into(out: np.ndarray, inputs: Sequence[np.ndarray], op: str = "sum") -> np.ndarray:
    """Store ``inputs[0] (op) inputs[1] (op) ...`` into ``out`` in one pass and return ``out``."""
    if op not in OP_CODES:
        raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(SUPPORTED_OPS)}")
    inputs = list(inputs)
    if not inputs:
        raise ValueError("reduce_into needs at least one input array, got an empty inputs list")
    out = _check_out(out, "out")
    if op in BITWISE_OPS and out.dtype.kind not in "iu":
        raise TypeError(f"op {op!r} is bitwise: it needs an integer dtype, got {dtype_name(out.dtype)}; bitwise "
                        f"ops take int8..int64 and uint8..uint64 (for {dtype_name(out.dtype)}: "
                        f"{', '.join(ARITHMETIC_OPS)})")
    half = out.dtype if out.dtype in HALF_CODES else None
    mixed = False
    flat: list[np.ndarray] = []
    for k, x in enumerate(inputs):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"inputs[{k}] must be a numpy.ndarray, got {type(x).__name__}")
        if x.dtype != out.dtype:
            # the one allowed mix: a float32 out accumulating float32 and one 16-bit float dtype
            if not (out.dtype == FLOAT32 and x.dtype in HALF_CODES and (half is None or half == x.dtype)):
                raise TypeError(
                    f"inputs[{k}] has dtype {dtype_name(x.dtype)} but out has {dtype_name(out.dtype)}; all "
                    "arrays must share out's dtype (or out float32 with float32 and one 16-bit float dtype)"
                )
            half, mixed = x.dtype, True
        flat.append(_prepare_input(x, k, out))
    if out.size == 0:
        return out
    out_flat = out.reshape(-1)
    if half is None:
        native = _backend(out.dtype, False).reduce_native
        run_split(lambda o, xs: native(o, xs, op), out_flat, flat)
    else:
        reduce_half = _backend(half, mixed).reduce_half
        run_split(lambda o, xs: reduce_half(o, xs, op, half), out_flat, flat)
    return out


def c_kernel(dtype: np.dtype) -> tuple[int, int] | None:
    """(kind, code) of the C kernel `reduce_into` calls for same-dtype inputs of `dtype`: kind 0 is
    `coll_reduce` with dtype code `code`, kind 1 `coll_reduce_half` with half code `code`. None when another
    backend serves the dtype (C extension missing, or a backend forced), so callers that run the C kernels
    themselves (the shared-memory plan runner) give the same bits as `reduce_into` would."""
    dtype = np.dtype(dtype)
    if _c is None or (_forced or PREFERRED.get(dtype)) != "c":
        return None
    if dtype in HALF_CODES:
        return 1, HALF_CODES[dtype]
    code = NATIVE_CODES.get(dtype)
    return None if code is None else (0, code)


def round_into(out: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Round float32 ``src`` to ``out``'s float16/bfloat16 (nearest-even) and return ``out``."""
    out = _check_out(out, "out")
    if out.dtype not in HALF_CODES:
        raise TypeError(f"round_into writes float16 or bfloat16, not {dtype_name(out.dtype)}")
    if not isinstance(src, np.ndarray) or src.dtype != FLOAT32:
        raise TypeError("round_into reads a float32 numpy.ndarray")
    flat = _prepare_input(src, 0, out)
    if out.size:
        _backend(out.dtype, True).reduce_half(out.reshape(-1), [flat], "sum", out.dtype)
    return out


def backend_info() -> dict[str, object]:
    """Which backend serves each dtype, whether the C extension loaded (or why not), and its CPU path."""
    return {
        "c_loaded": _c is not None,
        "c_error": _c_error,
        "cpu_path": _c.cpu_path() if _c is not None else None,
        "cpu_avx512": _c.avx512() if _c is not None else None,
        "forced": _forced,
        "backends": {
            dtype_name(dt): _forced or (PREFERRED[dt] if _c is not None else FALLBACK[dt])
            for dt in SUPPORTED_DTYPES
        },
        "native_dtypes": [dtype_name(dt) for dt in NATIVE_CODES],
        "threads": get_threads(),
    }
