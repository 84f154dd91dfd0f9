"""Deterministic per-rank inputs whose reduced results are exact, and the #wrong count against them.

Rank r's element at global index i (global: allgather block r starts at r*k) is
    sum/avg/min/max: (i mod m) + ((i + r) mod 3)        prod: 2 if (i + r) mod p == 0 else 1
with m = 251 (7 for bfloat16, 31 for float16), so every partial sum of p <= 32 ranks is an integer the dtype
holds exactly (bfloat16: 8 significant bits; float16: 11) and any reduction order gives the same bits; integer
dtypes wrap, which is order-independent too. Everything depends on i only modulo L = 3*m*p, so the reference is
computed once over one period (in float64 / the integer dtype) and tiled: checking costs O(count) numpy work,
and a chunk landing at the wrong offset shows up unless the offset is a multiple of L.
"""

from __future__ import annotations

import numpy as np

from ..kernels._dtypes import BFLOAT16, FLOAT16

_TOL = {np.dtype(np.float16): 1e-3, BFLOAT16: 1e-2, np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}


def _modulus(dtype: np.dtype) -> int:
    return 7 if dtype == BFLOAT16 else 31 if dtype == FLOAT16 else 251


class Pattern:
    """Inputs and references for one (dtype, op, world size)."""

    def __init__(self, dtype: np.dtype, op: str, world_size: int) -> None:
        self.dtype = np.dtype(dtype)
        self.op = op
        self.p = world_size
        m = _modulus(self.dtype)
        self.period = 3 * m * world_size
        i = np.arange(self.period, dtype=np.int64)
        rows = []
        for r in range(world_size):
            if op == "prod":
                rows.append(np.where((i + r) % world_size == 0, 2, 1))
            else:
                rows.append(i % m + (i + r) % 3)
        self._rows = [self._cast(row) for row in rows]  # one period of each rank's input
        self._ref = self._reference(rows)

    def _cast(self, values: np.ndarray) -> np.ndarray:
        if self.dtype.kind in "iu":
            return values.astype(self.dtype)  # wraps, as the kernels do
        return values.astype(np.float64).astype(self.dtype)

    def _reference(self, rows: list[np.ndarray]) -> np.ndarray:
        if self.dtype.kind in "iu":
            acc = [r.astype(self.dtype) for r in rows]
            ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                     "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[self.op]
            with np.errstate(over="ignore"):
                return ufunc.reduce(np.stack(acc), axis=0).astype(self.dtype)
        stack = np.stack([r.astype(np.float64) for r in rows])
        if self.op in ("sum", "avg"):
            out = stack.sum(axis=0)
            if self.op == "avg":
                out = out / self.p
        elif self.op == "prod":
            out = stack.prod(axis=0)
        elif self.op == "min":
            out = stack.min(axis=0)
        else:
            out = stack.max(axis=0)
        return out.astype(self.dtype)

    @staticmethod
    def _tile(period: np.ndarray, start: int, count: int) -> np.ndarray:
        if count == 0:
            return period[:0].copy()
        return np.resize(np.roll(period, -(start % period.size)), count)

    def input(self, rank: int, start: int, count: int) -> np.ndarray:
        """Rank `rank`'s elements [start, start + count) (a fresh writeable array)."""
        return self._tile(self._rows[rank], start, count)

    def reference(self, start: int, count: int) -> np.ndarray:
        """The reduction over all ranks of elements [start, start + count)."""
        return self._tile(self._ref, start, count)

    def gathered(self, k: int) -> np.ndarray:
        """allgather's output: rank r's block [r*k, (r+1)*k) of its own input."""
        if k == 0:
            return np.empty(0, self.dtype)
        return np.concatenate([self.input(r, r * k, k) for r in range(self.p)])

    def filler(self, count: int) -> np.ndarray:
        """A buffer no pattern value equals (non-root broadcast buffers start as this)."""
        return np.full(count, np.array(-1).astype(self.dtype))


def count_wrong(out: np.ndarray, expected: np.ndarray) -> int:
    """Elements of `out` that differ from `expected` (floats: beyond the dtype's rounding; NaN == NaN)."""
    out = np.asarray(out).reshape(-1)
    expected = np.asarray(expected).reshape(-1)
    if out.size != expected.size:
        return max(out.size, expected.size)
    if out.dtype.kind in "iub":
        return int(np.count_nonzero(out != expected))
    a, b = out.astype(np.float64), expected.astype(np.float64)
    tol = _TOL.get(out.dtype, 1e-6)
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(a - b) <= tol * np.abs(b)) | (np.isnan(a) & np.isnan(b)))
    return int(np.count_nonzero(bad))
