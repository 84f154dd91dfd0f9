"""The process group's per-call fast paths: all_reduce, all_gather_into_tensor, reduce_scatter_tensor and even
all_to_all_single of contiguous tensors, handed to the library as cached numpy views of the tensors themselves.

A mixin of CollectivesProcessGroup (process_group.py), which provides the general path of each call (`_allreduce`,
`_all_gather_single`, `_reduce_scatter_single`, `_all_to_all_single`: every check with its error, staging of
strided tensors, PREMUL_SUM, uneven splits), `_issue`, `_comm()`, `comm`, `_views`, `_bound` (BoundCalls) and
its `_by_address`, `_done`, `_size` and the coalescing list. A fast path only takes a call that the general path
would hand to the library unchanged, and anything else goes there: so every error is the general path's, raised
before any communication.

A fast path reads the op as `hash(opts.reduceOp)` (torch's ReduceOp hashes to its RedOpType value,
tensors.OPS_BY_HASH), takes the tensors' numpy views from the group's cache (`Views.get`, which checks dtype, device
and layout the first time it sees a tensor) and, when torch asked for a blocking call, nothing is being coalesced and
no call is in flight anywhere (`PENDING`), runs the library's blocking call on the caller's thread under `LOCK` and
returns the group's shared completed Work: a few reads of tens to hundreds of nanoseconds each (docs/torch.md,
"Per-call overhead"). That call is a persistent call (`Communicator.persistent`) bound once per tensor (all_reduce)
or pair of views (the other three) and kept in the group's BoundCalls, so a repeated call skips the library
method's argument handling, plan look-up and buffer checks too. A call that stays in flight after the method
returns (asynchronous, coalesced, or issued while another group's calls are in flight) must hand the library
arrays that keep the tensors alive, which the cached views do not (they do not own the memory): all_reduce then takes `tensor.numpy()` of its
tensor, the other three their general path.
"""

from __future__ import annotations

import numpy as np
import torch

from . import tensors as T
from .work import LOCK, PENDING

# module-level names for what every call reads (a global is one look-up, an attribute of a module two); `with LOCK`
# costs twice as much as acquire and release; PENDING.count is mutated in place, never rebound
_acquire, _release = LOCK.acquire, LOCK.release
_Tensor = torch.Tensor
_OPS = T.OPS_BY_HASH
_IN_FLIGHT = PENDING.count


class BoundCalls:
    """Persistent calls (`Communicator.persistent`) of the tensors a group used last: a hit is one run of the bound
    call, without the library method's look-ups.

    In-place allreduces by the tensor's data address (`by_address`: address -> (size, dtype, the op's
    `hash(ReduceOp)`, the call's run),
    looked up by DirectCalls.allreduce itself): reused for a tensor at the same address with the same size and
    dtype, and the same op. A hit needs no check of which tensor the entry was made for: the caller holds a
    (contiguous) tensor over those very bytes, which is what the bound call reads and writes. Calls with an input
    and an output (all_gather, reduce_scatter, all_to_all) by their pair of cached views (Views hands out the same
    view object only while its tensor is alive and unchanged). Like Views, the arrays do not own the memory, and
    the caller holds the tensors for the call."""

    SIZE = 64

    def __init__(self, views: T.Views) -> None:
        self._views = views
        self.by_address: dict[int, tuple] = {}
        self._pairs: dict[tuple, tuple] = {}

    def bind(self, t: torch.Tensor, op: str | None, key: int, comm):
        """Bind t's in-place allreduce with op (named by `key`, its `hash(ReduceOp)`; t: a contiguous tensor,
        `type(t) is torch.Tensor`) and return its run, or None when op is None or the library's call would refuse
        it (the caller's general path then raises the clear error)."""
        if op is None or comm is None:
            return None
        a = self._views.get(t)
        call = _persistent(comm, "allreduce", a, a, op) if a is not None else None
        if call is None:
            return None
        _remember(self.by_address, t.data_ptr(), (t.numel(), t.dtype, key, call.run))
        return call.run

    def pair(self, collective: str, x: np.ndarray, out: np.ndarray, op: str, comm):
        """The bound call of `collective` from view x into view out (views from Views.get), or None when the
        library would refuse it (the caller's general path raises the clear error)."""
        key = (collective, id(x), id(out))
        entry = self._pairs.get(key)
        if entry is not None and entry[0] is x and entry[1] is out and entry[2] is op:
            return entry[3]
        call = _persistent(comm, collective, x, out, op)
        if call is not None:
            _remember(self._pairs, key, (x, out, op, call))  # holding x and out keeps their ids from being reused
        return call


def _persistent(comm, collective: str, x: np.ndarray, out: np.ndarray, op: str):
    """comm's persistent call, or None where the library refuses it (e.g. a bitwise op on floats: the general
    path then says so)."""
    try:
        return comm.persistent(collective, x, out=out, op=op)
    except (TypeError, ValueError):
        return None


def _remember(table: dict, key, entry) -> None:
    """Add an entry to a bounded table, dropping its oldest first when full."""
    if len(table) >= BoundCalls.SIZE:
        table.pop(next(iter(table)))
    table[key] = entry


class DirectCalls:
    _pair: tuple = (None, None, False)  # the last (input view, output view, share no memory) checked

    def allreduce(self, tensors, opts=None):
        if opts is not None and len(tensors) == 1:
            t = tensors[0]
            key = hash(opts.reduceOp)  # the op's RedOpType value (tensors.OPS_BY_HASH)
            if type(t) is _Tensor and t.is_contiguous():
                if not opts.asyncOp and self._coalesced is None and not _IN_FLIGHT:
                    hit = self._by_address.get(t.data_ptr())
                    # an entry exists only for an op bound calls take, so the same key is the same op
                    if hit is not None and hit[0] == t.numel() and hit[1] is t.dtype and hit[2] == key:
                        run = hit[3]
                    else:  # None unless a dense CPU tensor of a supported dtype, and an op bound calls take
                        run = self._bound.bind(t, _OPS.get(key), key, self.comm)
                    if run is not None:
                        _acquire()
                        try:
                            run()
                        finally:
                            _release()
                        return self._done
                elif (op := _OPS.get(key)) is not None and self._views.get(t) is not None:
                    a = T.as_numpy(t)  # in flight after the return: an array that keeps the tensor alive
                    return self._issue("all_reduce", [(self._comm().allreduce, (a,), {"out": a, "op": op})], opts,
                                       None, tensors)
        return self._allreduce(tensors, opts)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        """all_gather_into_tensor: the output holds the ranks' inputs concatenated in rank order."""
        pair = self._views_of(output_tensor, input_tensor, 1, self._size)
        if pair is None:
            return self._all_gather_single(output_tensor, input_tensor, opts)
        x, out = pair
        comm = self._straight(opts)
        call = self._bound.pair("allgather", x, out, "sum", comm) if comm is not None else None
        if call is None:
            return self._all_gather_single(output_tensor, input_tensor, opts)
        _acquire()
        try:
            call.run()
        finally:
            _release()
        return self._done

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        """reduce_scatter_tensor: rank r gets block r of the reduced input (world_size x output elements)."""
        op = _OPS.get(hash(opts.reduceOp)) if opts is not None else None
        pair = self._views_of(output_tensor, input_tensor, self._size, 1) if op is not None else None
        if pair is None:
            return self._reduce_scatter_single(output_tensor, input_tensor, opts)
        x, out = pair
        comm = self._straight(opts)
        call = self._bound.pair("reduce_scatter", x, out, op, comm) if comm is not None else None
        if call is None:
            return self._reduce_scatter_single(output_tensor, input_tensor, opts)
        _acquire()
        try:
            call.run()
        finally:
            _release()
        return self._done

    _reduce_scatter_base = reduce_scatter_single

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single: split sizes count rows of dim 0 (empty: even splits)."""
        pair = None if output_split_sizes or input_split_sizes else self._views_of(output, input, 1, 1)
        if pair is None or pair[0].size % self._size:
            return self._all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)
        x, out = pair
        comm = self._straight(opts)
        call = self._bound.pair("alltoall", x, out, "sum", comm) if comm is not None else None
        if call is None:
            return self._all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)
        _acquire()
        try:
            call.run()
        finally:
            _release()
        return self._done

    alltoall_base = all_to_all_single

    # -- what the fast paths share ------------------------------------------------------------------------------
    def _views_of(self, output, input, out_times: int, in_times: int):
        """(input view, output view) when both are contiguous tensors of one supported dtype, the output's elements
        times out_times equal the input's times in_times (all_gather: 1 and p; reduce_scatter: p and 1), and they
        share no memory; else None."""
        if type(output) is not _Tensor or type(input) is not _Tensor or not output.is_contiguous() \
                or not input.is_contiguous():
            return None
        views = self._views
        x, out = views.get(input), views.get(output)
        if x is None or out is None or x.dtype != out.dtype or out_times * out.size != in_times * x.size:
            return None
        last = self._pair
        if last[0] is x and last[1] is out:  # cached views: the same objects while their tensors are unchanged
            apart = last[2]
        else:
            apart = not np.may_share_memory(x, out)
            self._pair = (x, out, apart)
        return (x, out) if apart else None

    def _straight(self, opts):
        """The communicator when the call can run as the library's blocking call on this thread (torch asked for a
        blocking call, nothing is being coalesced, nothing is in flight anywhere), else None."""
        comm = self.comm
        if opts is not None and not opts.asyncOp and self._coalesced is None and comm is not None \
                and not _IN_FLIGHT:
            return comm
        return None


__all__ = ["DirectCalls"]
