"""CPU tensors as the library's numpy arrays: dtypes, reduce ops, argument checks and zero-copy views.

A contiguous tensor becomes a numpy view of the same memory (bfloat16 through an int16 view reinterpreted as
ml_dtypes.bfloat16), so the library's kernels work on the tensor itself; a non-contiguous one is staged in a
contiguous copy that `Staged.done` writes back.
"""

from __future__ import annotations

import ctypes
import weakref

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist

BACKEND_NAME = "collectives"

DTYPES = {
    torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64), torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16), torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8), torch.uint16: np.dtype(np.uint16), torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
}
SUPPORTED_DTYPES = tuple(DTYPES)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_Red = dist.ReduceOp.RedOpType
OPS = {_Red.SUM: "sum", _Red.AVG: "avg", _Red.PRODUCT: "prod", _Red.MIN: "min", _Red.MAX: "max", _Red.BAND: "band",
       _Red.BOR: "bor", _Red.BXOR: "bxor", _Red.PREMUL_SUM: "premul_sum"}
OP_NAMES = "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR (integer dtypes), PREMUL_SUM (floating dtypes)"


def _ops_by_hash() -> dict[int, str]:
    """The ops without a factor (all but PREMUL_SUM) by `hash(ReduceOp)`. torch's ReduceOp hashes to its RedOpType
    value (`__hash__` in torch/csrc/distributed/c10d/init.cpp, kept since ReduceOp was an enum), so
    `hash(opts.reduceOp)` names the op in one C++ call (~0.35 us with the read), where `opts.reduceOp.op` builds a
    RedOpType object and the look-up hashes that pybind enum (~0.9 us). Empty (every look-up misses: the caller takes
    `reduce_op`) if a torch hashes otherwise."""
    table = {}
    for kind, name in OPS.items():
        if kind == _Red.PREMUL_SUM:
            continue
        value = int(kind)
        if hash(dist.ReduceOp(kind)) != value or hash(kind) != value:
            return {}
        table[value] = name
    return table


OPS_BY_HASH = _ops_by_hash()


def reduce_op(opts) -> tuple[str, object]:
    """(op name, PREMUL_SUM factor or None) of a torch options object (SUM when opts is None)."""
    if opts is None:
        return "sum", None
    op = opts.reduceOp
    try:
        kind = op.op  # a ReduceOp carries its RedOpType in .op
    except AttributeError:
        kind = op
    name = OPS.get(kind)
    if name is None:
        raise ValueError(f"backend 'collectives' does not support reduce op {kind}; supported: {OP_NAMES}")
    if name == "premul_sum":
        return name, op.factor
    return name, None


def check_premul(factor, t: torch.Tensor, what: str):
    """PREMUL_SUM's factor as torch multiplies by it (a Python number, or a one-element CPU tensor)."""
    if t.dtype not in FLOATS:
        raise TypeError(f"backend 'collectives': PREMUL_SUM needs a floating dtype ({what} is {t.dtype}); for "
                        "integers scale first and use SUM")
    if isinstance(factor, torch.Tensor):
        if factor.device.type != "cpu" or factor.numel() != 1:
            raise ValueError(f"backend 'collectives': the PREMUL_SUM factor must be a number or a one-element CPU "
                             f"tensor, got a tensor of {factor.numel()} elements on {factor.device}")
    return factor


def check(t, what: str) -> None:
    """Raise (before any communication) unless `t` is a dense CPU tensor of a supported dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"backend 'collectives' works on CPU tensors; {what} is on {t.device}")
    if t.dtype not in DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in DTYPES)
        raise TypeError(f"backend 'collectives' does not support dtype {t.dtype} ({what}); supported: {names} "
                        "(complex tensors: torch.distributed passes them as float pairs where the op allows)")
    if t.layout != torch.strided:
        raise TypeError(f"backend 'collectives' needs dense tensors; {what} has layout {t.layout}")


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a contiguous CPU tensor (bfloat16 as ml_dtypes.bfloat16)."""
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class Views:
    """numpy views of the tensors a group saw last, reused while the tensor is alive and unchanged (same storage
    address, size and dtype): a torch-to-numpy conversion costs about as much as the library's own 8-byte call.

    A cached view does not own the memory (it would keep a freed tensor alive): it is only handed out while a weak
    reference says the tensor itself is alive, and the caller holds the tensor for the call."""

    SIZE = 64

    def __init__(self) -> None:
        self._views: dict[int, tuple] = {}

    def get(self, t: torch.Tensor) -> np.ndarray | None:
        """t's numpy view (t: a contiguous tensor, `type(t) is torch.Tensor`), or None unless t is a dense CPU
        tensor of a supported dtype (the caller's general path then raises the clear error).

        A hit needs no further check: an entry is only made for a dense CPU tensor of a supported dtype, and a live
        tensor keeps its device and layout (torch refuses `.data =` across them), so the same tensor with the same
        storage address, size and dtype is still one."""
        entry = self._views.get(id(t))
        if entry is not None:
            ref, address, n, dtype, array = entry
            if ref() is t and address == t.data_ptr() and n == t.numel() and dtype is t.dtype:
                return array
        if not t.is_cpu or t.layout != torch.strided or t.dtype not in DTYPES:
            return None
        ptr = t.data_ptr()
        array = as_numpy(t)
        if array.size:  # rebuild it without an owner, as a plain view of the same bytes
            raw = (ctypes.c_char * array.nbytes).from_address(ptr)
            array = np.frombuffer(raw, dtype=array.dtype).reshape(array.shape)
        views = self._views
        if len(views) >= self.SIZE:
            views.pop(next(iter(views)))
        try:
            views[id(t)] = (weakref.ref(t), ptr, t.numel(), t.dtype, array)
        except TypeError:  # a tensor subclass without weak references: no caching
            pass
        return array


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous tensor as a flat uint8 numpy view (for calls that only move data)."""
    if t.requires_grad:
        t = t.detach()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


class Staged:
    """A tensor's contiguous stand-in: the tensor itself when contiguous, else a copy that `done` writes back.

    `copy_in=False` for outputs whose old values are never read."""

    __slots__ = ("tensor", "work", "array")

    def __init__(self, t: torch.Tensor, what: str, *, copy_in: bool = True) -> None:
        check(t, what)
        self.tensor = t
        if t.is_contiguous():
            self.work = t
        else:
            self.work = t.contiguous() if copy_in else torch.empty(t.shape, dtype=t.dtype)
        self.array = as_numpy(self.work)

    def done(self) -> None:
        if self.work is not self.tensor:
            with torch.no_grad():
                self.tensor.copy_(self.work)


def flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous flat tensor with t's elements (t itself, viewed, when contiguous)."""
    return t.detach().reshape(-1) if t.is_contiguous() else t.detach().contiguous().reshape(-1)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst[...] = src (same number of elements, any shapes), outside autograd."""
    with torch.no_grad():
        dst.copy_(src.view(dst.shape) if src.shape != dst.shape else src)


__all__ = ["BACKEND_NAME", "DTYPES", "FLOATS", "OPS", "OPS_BY_HASH", "SUPPORTED_DTYPES", "Staged", "Views", "as_bytes",
           "as_numpy", "check", "check_premul", "copy_into", "flat", "reduce_op"]
