"""The process group's per-call fast paths: all_reduce, all_gather_into_tensor, reduce_scatter_tensor and even
all_to_all_single of contiguous tensors, handed to the library as cached numpy views of the tensors themselves.

A mixin of CollectivesProcessGroup (process_group.py), which provides the general path of each call (`_allreduce`,
`_all_gather_single`, `_reduce_scatter_single`, `_all_to_all_single`: every check with its error, staging of
strided tensors, PREMUL_SUM, uneven splits), `_issue`, `_comm()`, `comm`, `_views`, `_done`, `_size` and the
coalescing list. A fast path only takes a call that the general path would hand to the library unchanged, and
anything else goes there: so every error is the general path's, raised before any communication.

A fast path reads the op as `hash(opts.reduceOp)` (torch's ReduceOp hashes to its RedOpType value,
tensors.OPS_BY_HASH), takes the tensors' numpy views from the group's cache (`Views.get`, which checks dtype, device
and layout the first time it sees a tensor) and, when torch asked for a blocking call, nothing is being coalesced and
no call is in flight anywhere (`PENDING`), runs the library's blocking call on the caller's thread under `LOCK` and
returns the group's shared completed Work: a few reads of tens to hundreds of nanoseconds each (docs/torch.md,
"Per-call overhead"). A call that stays in flight after the method returns (asynchronous,
coalesced, or issued while another group's calls are in flight) must hand the library arrays that keep the tensors
alive, which the cached views do not (they do not own the memory): all_reduce then takes `tensor.numpy()` of its
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


class DirectCalls:
    _pair: tuple = (None, None, False)  # the last (input view, output view, share no memory) checked

    def allreduce(self, tensors, opts=None):
        if opts is not None and len(tensors) == 1:
            op = _OPS.get(hash(opts.reduceOp))
            t = tensors[0]
            if op is not None and type(t) is _Tensor and t.is_contiguous():
                a = self._views.get(t)  # None unless a dense CPU tensor of a supported dtype
                if a is not None:
                    comm = self.comm
                    if not opts.asyncOp and self._coalesced is None and comm is not None and not _IN_FLIGHT:
                        _acquire()
                        try:
                            comm.allreduce(a, out=a, op=op)
                        finally:
                            _release()
                        return self._done
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
        if comm is None:
            return self._all_gather_single(output_tensor, input_tensor, opts)
        _acquire()
        try:
            comm.allgather(x, out=out)
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
        if comm is None:
            return self._reduce_scatter_single(output_tensor, input_tensor, opts)
        _acquire()
        try:
            comm.reduce_scatter(x, out=out, op=op)
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
        if comm is None:
            return self._all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)
        _acquire()
        try:
            comm.alltoall(x, out=out)
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
