"""A call's signature and its validation: the one validator of every collective's arguments.

A *signature* is what makes two calls the same plan: collective, element count and shape, dtype, op, root, how
the output is given (a new array, in place, or a separate array), algorithm and parameters, deterministic and
accumulate. `check_call` validates everything the signature fixes (once per plan), `check_buffers` what can
change from call to call with the same signature (contiguity, writeability, overlap of x and out): both raise
before any communication, naming what was wrong and what would be right, and never write a buffer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..emulator import check_accumulate
from ..kernels import SUPPORTED_DTYPES
from ..kernels._dtypes import dtype_name
from ..reduction import check_op
from ..schedule.collective import REDUCING, ROOTED

NEW, IN_PLACE, SEPARATE = 0, 1, 2  # how the output is given: out=None, out=x, another array


def output_mode(x: np.ndarray, out) -> int:
    return NEW if out is None else IN_PLACE if out is x else SEPARATE


def output_count(collective: str, count: int, p: int) -> int:
    """Elements of each rank's output."""
    if collective == "reduce_scatter":
        return count // p
    if collective in ("allgather", "gather"):
        return count * p
    return count


def output_shape(collective: str, shape: tuple[int, ...], p: int) -> tuple[int, ...]:
    """The shape of a new output array: reduce_scatter's block (a leading axis of p·k rows gives k rows),
    allgather's p blocks (stacked on the leading axis), else the input's shape."""
    size = int(np.prod(shape)) if shape else 1
    if collective == "reduce_scatter":
        return (shape[0] // p, *shape[1:]) if shape and shape[0] % p == 0 else (size // p,)
    if collective in ("allgather", "gather"):
        return (p * shape[0], *shape[1:]) if shape else (p,)
    return shape


@dataclass(frozen=True)
class Signature:
    """What every rank of a call must agree on (the call agreement compares a hash of it)."""

    collective: str
    count: int
    dtype: str
    op: str
    root: int | None
    algorithm: str  # as requested
    chosen: str  # the algorithm and parameters the plan runs
    accumulate: str
    deterministic: bool

    def digest(self) -> int:
        """A stable signed 64-bit hash (the same on every host and run)."""
        text = repr((self.collective, self.count, self.dtype, self.op, self.root, self.algorithm, self.chosen,
                     self.accumulate, self.deterministic)).encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


def check_timeout(value, where: str = "timeout") -> float | None:
    """A timeout in seconds: None (or inf) waits forever, else a positive number; ValueError otherwise
    (a negative or NaN timeout would make every wait expire at once, or never)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a number of seconds > 0 or None (wait forever), got {value!r}") from None
    if not seconds > 0:  # negative, zero or NaN (inf is allowed: a deadline that never comes)
        raise ValueError(f"{where} must be a number of seconds > 0 or None (wait forever), got {value!r}")
    return seconds


def _check_writable(a: np.ndarray, name: str) -> None:
    if not a.flags.writeable:
        raise ValueError(f"{name} is read-only; pass a writeable array (np.array(a) makes a copy)")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; pass np.ascontiguousarray(a) or a fresh array")


def check_input(collective: str, x) -> np.ndarray:
    """x as an ndarray of a supported dtype (broadcast: x itself, writeable and contiguous: it is written)."""
    if collective == "broadcast":
        if not isinstance(x, np.ndarray):
            raise TypeError(f"broadcast works in place: x must be a numpy.ndarray, got {type(x).__name__}")
        _check_writable(x, "x (broadcast writes it in place)")
    else:
        x = np.asarray(x)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"unsupported dtype {x.dtype}; supported: "
                        f"{', '.join(dtype_name(d) for d in SUPPORTED_DTYPES)}")
    return x


def check_call(collective: str, x: np.ndarray, op: str, root, p: int, accumulate) -> tuple[str, int | None]:
    """Validate what the signature fixes; returns (the kernel op, the root as an int or None)."""
    kernel_op = check_op(op, x.dtype) if collective in REDUCING else "sum"
    if collective in (*ROOTED, "gather", "scatter"):
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < p:
            raise ValueError(f"{collective} root must be an integer in [0, {p}), got {root!r}")
        root = int(root)
    else:
        root = None
    if collective == "reduce_scatter" and x.size % p:
        raise ValueError(f"reduce_scatter input must have a multiple of the world size {p} elements "
                         f"(p·k, rank r gets block r), got {x.size}")
    if collective == "alltoall" and x.size % p:
        raise ValueError(f"alltoall input must have a multiple of the world size {p} elements (p blocks of k, "
                         f"block d for rank d), got {x.size}; for uneven blocks use alltoallv")
    check_accumulate(accumulate)
    return kernel_op, root


def check_buffers(collective: str, x: np.ndarray, out, p: int) -> None:
    """Validate out against x (raises naming what is wrong); x is already an ndarray of a supported dtype."""
    if collective == "broadcast":  # in place (a later call may pass an array made read-only since)
        _check_writable(x, "x (broadcast writes it in place)")
        return
    if out is None:
        return
    n = x.size
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != x.dtype:
        raise TypeError(f"out has dtype {dtype_name(out.dtype)} but x has {dtype_name(x.dtype)}; they must match")
    want = output_count(collective, n, p)
    if out.size != want:
        raise ValueError(f"{collective} out must have {want} elements for an input of {n} on {p} ranks, "
                         f"got {out.size}")
    _check_writable(out, "out")
    if out is not x and out.size and np.may_share_memory(out, x):
        raise ValueError("out overlaps x without being x itself; pass out=x (in place) or separate arrays")


def check_split(counts, p: int, what: str) -> tuple[int, ...]:
    """An alltoallv split (elements to or from each rank) as a tuple of p ints >= 0, or ValueError."""
    try:
        values = tuple(int(c) for c in counts)
        if any(int(c) != c for c in counts):
            raise ValueError
    except (TypeError, ValueError):
        raise TypeError(f"alltoallv {what} must be {p} integers (elements for each rank), got {counts!r}") from None
    if len(values) != p or any(v < 0 for v in values):
        raise ValueError(f"alltoallv {what} must be {p} integers >= 0 (one per rank), got {list(values)}")
    return values


def check_v_out(x: np.ndarray, out, want: int, p: int) -> None:
    """alltoallv's `out`: `want` elements of x's dtype, writeable, C-contiguous, apart from x."""
    if not isinstance(out, np.ndarray) or out.dtype != x.dtype or out.size != want:
        raise ValueError(f"alltoallv out must be a numpy.ndarray of {want} elements of x's dtype (the sum of "
                         f"recv_counts), got {getattr(out, 'size', type(out).__name__)} elements")
    check_buffers("allreduce", out.reshape(-1), None, p)
    if not out.flags.writeable or not out.flags.c_contiguous:
        raise ValueError("alltoallv out must be writeable and C-contiguous")
    if out.size and np.may_share_memory(out, x):
        raise ValueError("alltoallv out overlaps x; pass separate arrays")


def buffers_fit(x: np.ndarray, out, mode: int, want: int) -> bool:
    """The per-call fast check: True when x and out need no validation beyond what the plan fixed (the plan key
    holds x's dtype and shape and the output mode). False: call check_buffers for the precise error, or make
    x contiguous."""
    if not x.flags.c_contiguous:
        return False
    if mode == SEPARATE:
        return type(out) is np.ndarray and out.dtype == x.dtype and out.size == want and out.flags.writeable \
            and out.flags.c_contiguous and not ((out.base is not None or x.base is not None)
                                                and np.may_share_memory(x, out))
    return mode != IN_PLACE or x.flags.writeable


__all__ = ["IN_PLACE", "NEW", "SEPARATE", "Signature", "buffers_fit", "check_buffers", "check_call", "check_input",
           "check_timeout", "output_count", "output_mode", "output_shape"]
