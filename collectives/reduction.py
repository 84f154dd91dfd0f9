"""Reduction operators as executors apply them: validation, the kernel op, and `avg`'s final division."""

from __future__ import annotations

import numpy as np

OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
BITWISE = ("band", "bor", "bxor")  # bitwise and, or, xor: integer dtypes only


def check_op(op: str, dtype: np.dtype | None = None) -> str:
    """Return the kernel op for `op` (avg reduces with sum), raising ValueError naming the valid choices."""
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; valid ops: {', '.join(OPS)}")
    if op in BITWISE and dtype is not None and np.dtype(dtype).kind not in "iu":
        raise ValueError(f"op {op!r} is bitwise and needs an integer dtype, got {np.dtype(dtype).name}; "
                         "bitwise ops take int8..int64 and uint8..uint64")
    if op == "avg" and dtype is not None and np.dtype(dtype).kind in "iub":
        raise ValueError(f"op 'avg' needs a floating-point dtype, got {np.dtype(dtype).name}; "
                         "use op='sum' and divide, or cast to a float dtype")
    return "sum" if op == "avg" else op


def finalize(out: np.ndarray, op: str, world_size: int) -> None:
    """Apply the last step of `op` in place: avg divides the sum once, by the world size."""
    if op != "avg" or out.size == 0:
        return
    if out.dtype.itemsize == 2:  # float16 / bfloat16: divide in float32, round once
        out[...] = (out.astype(np.float32) / np.float32(world_size)).astype(out.dtype)
    else:
        out /= out.dtype.type(world_size)
