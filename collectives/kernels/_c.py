"""Backend "c": the cffi-compiled kernels in collectives._ckernels (source: csrc/reduce.c).

Importing this module raises ImportError when the extension is missing or disabled; the package
then falls back (see collectives.kernels.__init__).
"""

from __future__ import annotations

import numpy as np

from .. import environment
from ._dtypes import HALF_CODES, NATIVE_CODES, OP_CODES

if environment.get("COLLECTIVES_NO_C_KERNELS"):
    raise ImportError("disabled by the environment variable COLLECTIVES_NO_C_KERNELS")

from collectives._ckernels import ffi, lib  # noqa: E402


def _buf(a: np.ndarray):
    # ml_dtypes arrays do not export the buffer protocol; a 16-bit view does
    return ffi.from_buffer(a.view(np.uint16) if a.dtype in HALF_CODES else a)


def _pointers(arrays: list[np.ndarray]):
    return ffi.new("void *[]", [_buf(a) for a in arrays])


def reduce_native(out: np.ndarray, inputs: list[np.ndarray], op: str) -> None:
    """Same-dtype reduction; arrays already validated, contiguous and of equal size."""
    ptrs = _pointers(inputs)
    rc = lib.coll_reduce(NATIVE_CODES[out.dtype], OP_CODES[op], ffi.from_buffer(out), ptrs, len(inputs), out.size)
    assert rc == 0, rc


def reduce_half(out: np.ndarray, inputs: list[np.ndarray], op: str, half: np.dtype) -> None:
    """16-bit reduction (float32 accumulation); `out` and each input are `half` or float32."""
    ptrs = _pointers(inputs)
    in_f32 = ffi.new("unsigned char[]", [a.dtype != half for a in inputs])
    rc = lib.coll_reduce_half(HALF_CODES[half], OP_CODES[op], _buf(out), int(out.dtype != half),
                              ptrs, in_f32, len(inputs), out.size)
    assert rc == 0, rc


def cpu_path() -> str:
    return "avx2+f16c" if lib.coll_cpu_path() else "portable scalar"


def avx512() -> bool:
    """True when the AVX2 path also runs its AVX-512 (avx512f + avx512bw) 16-bit variants."""
    return bool(lib.coll_cpu_avx512())


def force_portable(on: bool) -> None:
    """Use the portable C code path even where AVX2/F16C exist (for tests)."""
    lib.coll_force_portable(int(on))
