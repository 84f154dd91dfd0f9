"""Backend "numba": the same fused block-wise fold as csrc/reduce.c, JIT-compiled by Numba.

Serves when the C extension is missing (second tier, before numpy). Numba has no float16 on the CPU,
so 16-bit floats travel as uint16 and are widened/narrowed with integer bit operations that give the
same bits as the C kernels (bfloat16: a shift and round-to-nearest-even; float16: IEEE conversion).
Inputs are passed as a numba typed List, which compiles once per dtype whatever the input count.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.typed import List

from ._dtypes import BFLOAT16, OP_CODES

BLOCK = 1024
_SUM, _PROD, _MIN, _MAX, _BAND, _BOR = (OP_CODES[k] for k in ("sum", "prod", "min", "max", "band", "bor"))
BITWISE = frozenset(("band", "bor", "bxor"))


@numba.njit(cache=True, nogil=True)
def _fold(op, acc, src, s, m):
    if op == _SUM:
        for i in range(m):
            acc[i] = acc[i] + src[s + i]
    elif op == _PROD:
        for i in range(m):
            acc[i] = acc[i] * src[s + i]
    elif op == _MIN:
        for i in range(m):
            x = acc[i]
            y = src[s + i]
            acc[i] = x if (x != x or x < y) else y
    else:
        for i in range(m):
            x = acc[i]
            y = src[s + i]
            acc[i] = x if (x != x or x > y) else y


@numba.njit(cache=True, nogil=True)
def _reduce_native(out, inputs, op):
    count = out.size
    acc = np.empty(min(BLOCK, count), out.dtype)
    for s in range(0, count, BLOCK):
        m = min(BLOCK, count - s)
        first = inputs[0]
        for i in range(m):
            acc[i] = first[s + i]
        for k in range(1, len(inputs)):
            _fold(op, acc, inputs[k], s, m)
        for i in range(m):
            out[s + i] = acc[i]


@numba.njit(cache=True, nogil=True)
def _reduce_bits(out, inputs, op):
    """Bitwise and/or/xor of unsigned integer arrays (compiled apart: numba types every branch, and floats
    have no bitwise operators)."""
    count = out.size
    acc = np.empty(min(BLOCK, count), out.dtype)
    for s in range(0, count, BLOCK):
        m = min(BLOCK, count - s)
        first = inputs[0]
        for i in range(m):
            acc[i] = first[s + i]
        for k in range(1, len(inputs)):
            src = inputs[k]
            if op == _BAND:
                for i in range(m):
                    acc[i] = acc[i] & src[s + i]
            elif op == _BOR:
                for i in range(m):
                    acc[i] = acc[i] | src[s + i]
            else:
                for i in range(m):
                    acc[i] = acc[i] ^ src[s + i]
        for i in range(m):
            out[s + i] = acc[i]


@numba.njit(cache=True, nogil=True, inline="always")
def _h2f_bits(h):
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    man = h & np.uint32(0x3FF)
    if exp == 0x1F:
        quiet = np.uint32(0x400000) if man != 0 else np.uint32(0)
        return sign | np.uint32(0x7F800000) | (man << np.uint32(13)) | quiet
    if exp == 0:
        if man == 0:
            return sign
        e = np.uint32(113)
        while (man & np.uint32(0x400)) == 0:
            man <<= np.uint32(1)
            e -= np.uint32(1)
        return sign | (e << np.uint32(23)) | ((man & np.uint32(0x3FF)) << np.uint32(13))
    return sign | ((exp + np.uint32(112)) << np.uint32(23)) | (man << np.uint32(13))


@numba.njit(cache=True, nogil=True, inline="always")
def _f2h_bits(x):
    sign = np.uint16((x >> np.uint32(16)) & np.uint32(0x8000))
    ax = x & np.uint32(0x7FFFFFFF)
    if ax > np.uint32(0x7F800000):
        return np.uint16(sign | np.uint32(0x7E00) | ((ax >> np.uint32(13)) & np.uint32(0x3FF)))
    if ax >= np.uint32(0x477FF000):
        return np.uint16(sign | np.uint32(0x7C00))
    if ax < np.uint32(0x38800000):
        e = ax >> np.uint32(23)
        if e < np.uint32(102):
            return sign
        m = (ax & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        shift = np.uint32(126) - e
        r = m >> shift
        rem = m & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rem > half or (rem == half and (r & np.uint32(1)) != 0):
            r += np.uint32(1)
        return np.uint16(sign | r)
    r = (ax - np.uint32(0x38000000)) >> np.uint32(13)
    rem = ax & np.uint32(0x1FFF)
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (r & np.uint32(1)) != 0):
        r += np.uint32(1)
    return np.uint16(sign | r)


@numba.njit(cache=True, nogil=True)
def _widen(is_bf16, dst_bits, src, s, m):
    if is_bf16:
        for i in range(m):
            dst_bits[i] = np.uint32(src[s + i]) << np.uint32(16)
    else:
        for i in range(m):
            dst_bits[i] = _h2f_bits(src[s + i])


@numba.njit(cache=True, nogil=True)
def _reduce_half(out, inputs, op, is_bf16):
    """out and inputs: uint16 bit patterns of float16 (is_bf16=False) or bfloat16 (is_bf16=True)."""
    count = out.size
    acc_bits = np.empty(min(BLOCK, count), np.uint32)
    tmp_bits = np.empty(min(BLOCK, count), np.uint32)
    acc = acc_bits.view(np.float32)
    tmp = tmp_bits.view(np.float32)
    for s in range(0, count, BLOCK):
        m = min(BLOCK, count - s)
        _widen(is_bf16, acc_bits, inputs[0], s, m)
        for k in range(1, len(inputs)):
            _widen(is_bf16, tmp_bits, inputs[k], s, m)
            _fold(op, acc, tmp, 0, m)
        if is_bf16:
            for i in range(m):
                x = acc_bits[i]
                if (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                    out[s + i] = np.uint16((x >> np.uint32(16)) | np.uint32(0x40))
                else:
                    out[s + i] = np.uint16((x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
        else:
            for i in range(m):
                out[s + i] = _f2h_bits(acc_bits[i])


def _typed(arrays: list[np.ndarray]) -> List:
    lst = List()
    for a in arrays:
        lst.append(a)
    return lst


def _unsigned(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def reduce_native(out: np.ndarray, inputs: list[np.ndarray], op: str) -> None:
    """Same-dtype reduction; signed integer sums/products run on unsigned views (wraparound)."""
    if len(inputs) == 1:
        np.copyto(out, inputs[0])
        return
    if op in BITWISE:  # integer dtypes only (reduce_into checked): the same bits on the unsigned type
        _reduce_bits(_unsigned(out).reshape(-1), _typed([_unsigned(a).reshape(-1) for a in inputs]), OP_CODES[op])
        return
    if out.dtype.kind == "i" and op in ("sum", "prod"):
        out, inputs = _unsigned(out), [_unsigned(a) for a in inputs]
    _reduce_native(out.reshape(-1), _typed([a.reshape(-1) for a in inputs]), OP_CODES[op])


def reduce_half(out: np.ndarray, inputs: list[np.ndarray], op: str, half: np.dtype) -> None:
    """16-bit reduction, all arrays of dtype `half` (mixed float32 accumulation is not handled here)."""
    if len(inputs) == 1:
        np.copyto(out, inputs[0])
        return
    bits = [a.reshape(-1).view(np.uint16) for a in inputs]
    _reduce_half(out.reshape(-1).view(np.uint16), _typed(bits), OP_CODES[op], half == BFLOAT16)
