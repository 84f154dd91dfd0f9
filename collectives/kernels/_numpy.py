"""Backend "numpy": the reference semantics written with numpy ufuncs; the last-resort fallback.

Works block by block (BLOCK elements at a time) so the float32 accumulator of 16-bit reductions stays
small and the data stays in cache between the folds of one block.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import FLOAT32

BLOCK = 1 << 16
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
          "bor": np.bitwise_or, "bxor": np.bitwise_xor}


@np.errstate(all="ignore")  # like the C kernels: inf/NaN results are data, not warnings
def reduce_native(out: np.ndarray, inputs: list[np.ndarray], op: str) -> None:
    """Same-dtype reduction: numpy's own wrapping integer and left-to-right float arithmetic."""
    ufunc = UFUNCS[op]
    if len(inputs) == 1:
        np.copyto(out, inputs[0])
        return
    acc = np.empty(min(out.size, BLOCK), out.dtype)
    for s in range(0, out.size, BLOCK):
        e = min(s + BLOCK, out.size)
        a = acc[: e - s]
        ufunc(inputs[0][s:e], inputs[1][s:e], out=a)
        for x in inputs[2:]:
            ufunc(a, x[s:e], out=a)
        out[s:e] = a


@np.errstate(all="ignore")
def reduce_half(out: np.ndarray, inputs: list[np.ndarray], op: str, half: np.dtype) -> None:
    """16-bit (or mixed float32/16-bit) reduction: widen to float32, fold, round once (astype is RNE)."""
    if len(inputs) == 1 and out.dtype == inputs[0].dtype:
        np.copyto(out, inputs[0])
        return
    ufunc = UFUNCS[op]
    acc = np.empty(min(out.size, BLOCK), FLOAT32)
    for s in range(0, out.size, BLOCK):
        e = min(s + BLOCK, out.size)
        a = acc[: e - s]
        a[...] = inputs[0][s:e]
        for x in inputs[1:]:
            ufunc(a, x[s:e].astype(FLOAT32), out=a)
        out[s:e] = a.astype(out.dtype)
