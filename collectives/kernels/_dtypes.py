"""The dtypes and ops the kernels support, and the codes the C kernels know them by (csrc/reduce.h)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)

# enum coll_dtype in csrc/reduce.h
NATIVE_CODES: dict[np.dtype, int] = {
    np.dtype(np.float32): 0,
    np.dtype(np.float64): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.uint8): 6,
    np.dtype(np.uint16): 7,
    np.dtype(np.uint32): 8,
    np.dtype(np.uint64): 9,
}
# enum coll_half: 16-bit floats, accumulated in float32 and rounded once
HALF_CODES: dict[np.dtype, int] = {FLOAT16: 0, BFLOAT16: 1}

SUPPORTED_DTYPES: tuple[np.dtype, ...] = (FLOAT16, BFLOAT16, *NATIVE_CODES)
# enum coll_op
OP_CODES: dict[str, int] = {"sum": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}
SUPPORTED_OPS: tuple[str, ...] = tuple(OP_CODES)
# bitwise and, or, xor: integer dtypes only (the bits of a float have no meaningful bitwise reduction)
BITWISE_OPS: tuple[str, ...] = ("band", "bor", "bxor")
ARITHMETIC_OPS: tuple[str, ...] = tuple(op for op in SUPPORTED_OPS if op not in BITWISE_OPS)


def ops_for(dtype: np.dtype) -> tuple[str, ...]:
    """The kernel ops defined for `dtype`: every op for integers, the arithmetic ones for floats."""
    return SUPPORTED_OPS if np.dtype(dtype).kind in "iu" else ARITHMETIC_OPS


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == BFLOAT16 else dtype.name
