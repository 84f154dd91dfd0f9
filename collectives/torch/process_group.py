"""A torch.distributed ProcessGroup (Python subclass) that runs the library's calls on CPU tensors.

Every method validates its tensors (before any communication), turns them into zero-copy numpy views
(tensors.py) and issues the library call(s) on the group's `collectives.Communicator`. all_reduce,
all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single first try their fast paths (direct.py: the
common call with the fewest steps) and come here, to `_allreduce` and the like, for everything else:

* a blocking call (torch passes `asyncOp=False`) runs the library's blocking call on the caller's thread and
  returns a completed Work: no queue, no thread hand-off (the per-call cost stays close to the library's own);
* an asynchronous one issues the library's call with `async_op=True` and returns a `CollectivesWork` (work.py)
  over the library's handle: `wait(timeout)`, `is_completed()`, `get_future()` (completed by the driver thread
  if nobody waits), errors raised by `wait()` and set on the future.

Method names and argument orders are those torch 2.13's `distributed_c10d` calls on a group (and that its C++
`PyProcessGroup` trampoline forwards: DDP's reducer, functional collectives).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..errors import CollectivesError
from . import tensors as T
from .direct import BoundCalls, DirectCalls
from .point_to_point import MONITORED_BARRIER_TAG, PointToPoint
from .work import LOCK, PENDING, CollectivesWork, CompletedWork, GroupWork

BACKEND_NAME = T.BACKEND_NAME


class CollectivesProcessGroup(DirectCalls, PointToPoint, dist.ProcessGroup):
    """torch.distributed process group over a `collectives.Communicator` (ranks = the communicator's ranks)."""

    def __init__(self, comm, rank: int, size: int, timeout: float | None = None) -> None:
        super().__init__(rank, size)
        if comm.rank != rank or comm.size != size:
            raise ValueError(
                f"backend 'collectives': torch gave rank {rank} of {size}, but the MPI communicator has rank "
                f"{comm.rank} of {comm.size}; under mpiexec pass rank/world_size from MPI (or use "
                "collectives.torch.init_process_group(), which does)")
        self.comm = comm
        self._rank = rank
        self._size = size
        self.timeout = timeout  # seconds (torch's timeout of the group), None: the library's default
        self._coalesced: list | None = None  # Works issued between _start_coalescing and _end_coalescing
        self._group_name = ""
        self._group_desc = ""
        self._views = T.Views()
        self._bound = BoundCalls(self._views)
        self._by_address = self._bound.by_address  # read by every all_reduce (DirectCalls.allreduce)
        self._done = CompletedWork()  # what a blocking call returns (torch only calls wait() on it)

    # -- identity -------------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    # torch names every group (destroy_process_group and functional collectives find it by name); the C++
    # base would keep the name on a C++ backend, which this Python group does not have
    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def __repr__(self) -> str:
        return f"CollectivesProcessGroup(rank={self._rank}, size={self._size})"

    # -- issuing ----------------------------------------------------------------------------------------
    def _comm(self):
        if self.comm is None:
            raise RuntimeError("backend 'collectives': this process group was destroyed (destroy_process_group); "
                               "create a new one")
        return self.comm

    def _issue(self, what: str, calls: list, opts, finish=None, result=None) -> dist._Work:
        """Run `calls` ((bound library method, args, kwargs) each): blocking when torch asked for a blocking call,
        else asynchronously (see the module docstring). `finish` runs once they completed (copy-backs)."""
        comm = self._comm()
        if opts is not None and not opts.asyncOp and self._coalesced is None:
            if not PENDING.elsewhere(id(comm)):
                with LOCK:
                    for fn, args, kwargs in calls:
                        fn(*args, **kwargs)
                if finish is not None:
                    finish()
                return self._done
            # another group has calls in flight: issue asynchronously, and wait without holding the lock
            self._issue_async(what, calls, finish, result).wait()
            return self._done
        return self._issue_async(what, calls, finish, result)

    def _issue_async(self, what: str, calls: list, finish, result, source=None):
        """The library's failures while issuing (a timeout in the collective setup of a new plan, a dead peer) go
        into the Work, as torch expects of an asynchronous call; bad arguments raise here."""
        with LOCK:
            try:
                handles = [fn(*args, async_op=True, **kwargs) for fn, args, kwargs in calls]
            except CollectivesError as exc:
                return CompletedWork(result, exc)
            work = CollectivesWork(self, what, [h for h in handles if h is not None], finish, result, source)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    # -- reductions -----------------------------------------------------------------------------------
    def _allreduce(self, tensors, opts=None):
        """all_reduce's general path (direct.py has the fast one)."""
        op, factor = T.reduce_op(opts)
        if any(isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, op)
        staged = [T.Staged(t, "all_reduce tensor") for t in tensors]
        if factor is not None:
            op = self._premultiply(staged, factor)
        calls = [(self._comm().allreduce, (s.array,), {"out": s.array, "op": op}) for s in staged]
        return self._issue("all_reduce", calls, opts, lambda: [s.done() for s in staged], list(tensors))

    def _sparse_allreduce(self, tensors, op: str):
        """all_reduce SUM of sparse COO tensors (as gloo): every rank's indices and values are all-gathered (padded
        to the largest count of non-zeros), concatenated and coalesced (duplicates summed); each tensor is replaced
        by the sum, in place. Runs to completion before it returns (also for async_op=True)."""
        if op != "sum":
            raise ValueError(f"backend 'collectives': sparse all_reduce supports SUM only, got {op.upper()}")
        comm, p = self._comm(), self._size
        for t in tensors:
            if t.layout != torch.sparse_coo or t.device.type != "cpu" or t.dtype not in T.DTYPES:
                raise TypeError("backend 'collectives': a sparse all_reduce takes sparse COO CPU tensors of a "
                                f"supported dtype, got {t.layout} {t.dtype} on {t.device}")
            local = t.coalesce()
            indices, values = local.indices().contiguous(), local.values().contiguous()
            counts = np.empty(p, np.int64)
            with LOCK:
                comm.allgather(np.array([indices.shape[1]], np.int64), out=counts)
            width = int(counts.max())
            rows = int(np.prod(values.shape[1:], dtype=np.int64))  # elements per non-zero (dense trailing dims)
            idx = torch.zeros(indices.shape[0], width, dtype=torch.int64)
            idx[:, :indices.shape[1]] = indices
            val = torch.zeros(width * rows, dtype=values.dtype)
            val[:values.numel()] = values.reshape(-1)
            all_idx = torch.empty(p, *idx.shape, dtype=torch.int64)
            all_val = torch.empty(p, width * rows, dtype=values.dtype)
            with LOCK:
                comm.allgather(T.as_numpy(idx.reshape(-1)), out=T.as_numpy(all_idx.reshape(-1)))
                comm.allgather(T.as_bytes(val), out=T.as_bytes(all_val.reshape(-1)))
            parts = [(all_idx[r][:, :counts[r]], all_val[r][:counts[r] * rows].view(int(counts[r]), *values.shape[1:]))
                     for r in range(p)]
            total = torch.sparse_coo_tensor(torch.cat([i for i, _ in parts], dim=1),
                                            torch.cat([v for _, v in parts]), t.shape).coalesce()
            with torch.no_grad():
                t.copy_(total)
        return CompletedWork(list(tensors))

    @staticmethod
    def _premultiply(staged: list, factor) -> str:
        """PREMUL_SUM (torch's definition: every rank scales its input by the factor, then the inputs are summed):
        scale the staged tensors in place (torch's own multiply: the product rounded once in the dtype); SUM."""
        with torch.no_grad():
            for s in staged:  # the tensor is the call's output: scaling it (or its staged copy) in place is fine
                T.check_premul(factor, s.tensor, "all_reduce tensor")
                s.work.mul_(factor)
        return "sum"

    def allreduce_coalesced(self, tensors, opts=None):
        """all_reduce_coalesced / the coalescing manager: the tensors of each dtype packed into one buffer, one
        library call per dtype, results copied back."""
        op, factor = T.reduce_op(opts)
        if not tensors:
            return CompletedWork([])
        for t in tensors:
            T.check(t, "all_reduce_coalesced tensor")
            if factor is not None:
                T.check_premul(factor, t, "all_reduce_coalesced tensor")
        by_dtype: dict = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        calls, packs = [], []
        for ts in by_dtype.values():
            packed = torch.cat([T.flat(t) for t in ts])
            if factor is not None:
                packed.mul_(factor)
            a = T.as_numpy(packed)
            calls.append((self._comm().allreduce, (a,), {"out": a, "op": "sum" if factor is not None else op}))
            packs.append((packed, ts))

        def finish():
            for packed, ts in packs:
                offset = 0
                for t in ts:
                    T.copy_into(t, packed[offset:offset + t.numel()])
                    offset += t.numel()
        return self._issue("all_reduce_coalesced", calls, opts, finish, list(tensors))

    def reduce(self, tensors, opts=None):
        op, factor = T.reduce_op(opts)
        root = int(opts.rootRank) if opts is not None else 0
        staged = [T.Staged(t, "reduce tensor") for t in tensors]
        if factor is not None or self._rank != root:
            # off the root the caller's tensor must stay as it was: reduce a copy (scaled for PREMUL_SUM)
            copies = []
            for s in staged:
                c = s.work.detach().clone()
                if factor is not None:
                    T.check_premul(factor, s.tensor, "reduce tensor")
                    c.mul_(factor)
                copies.append(c)
            arrays = [T.as_numpy(c) for c in copies]
            op = "sum" if factor is not None else op
        else:
            copies, arrays = None, [s.array for s in staged]
        calls = [(self._comm().reduce, (a,), {"out": a, "root": root, "op": op}) for a in arrays]

        def finish():
            if self._rank == root:
                for k, s in enumerate(staged):
                    if copies is not None:
                        T.copy_into(s.work, copies[k])
                    s.done()
        return self._issue("reduce", calls, opts, finish, list(tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """Rank r gets the reduction of every rank's input_list[r]. The blocks may differ in size (block r has
        rank r's output size): they are padded to the largest, reduce-scattered, and the padding dropped."""
        op, factor = T.reduce_op(opts)
        jobs = []
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            dst = T.Staged(out, "reduce_scatter output", copy_in=False)
            if len(ins) != self._size:
                raise ValueError(f"reduce_scatter needs {self._size} input tensors (one per rank), got {len(ins)}")
            for t in ins:
                T.check(t, "reduce_scatter input")
                if t.dtype != out.dtype:
                    raise ValueError(f"reduce_scatter inputs must have the output's dtype {out.dtype}, got {t.dtype}")
            if ins[self._rank].numel() != out.numel():
                raise ValueError(f"reduce_scatter: input_list[{self._rank}] has {ins[self._rank].numel()} elements "
                                 f"but the output has {out.numel()}; block r must have rank r's output size")
            width = max(t.numel() for t in ins)
            packed = torch.zeros(self._size * width, dtype=out.dtype)
            for k, t in enumerate(ins):
                packed[k * width:k * width + t.numel()] = T.flat(t)
            if factor is not None:
                T.check_premul(factor, out, "reduce_scatter output")
                packed.mul_(factor)
            block = torch.empty(width, dtype=out.dtype)
            jobs.append((dst, packed, block))
        op = "sum" if factor is not None else op
        calls = [(self._comm().reduce_scatter, (T.as_numpy(p),), {"out": T.as_numpy(b), "op": op})
                 for _, p, b in jobs]

        def finish():
            for dst, _, block in jobs:
                T.copy_into(dst.work, block[:dst.work.numel()])
                dst.done()
        return self._issue("reduce_scatter", calls, opts, finish, list(output_tensors))

    def _reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        """reduce_scatter_tensor's general path: rank r gets block r of the reduced input."""
        op, factor = T.reduce_op(opts)
        src = T.Staged(input_tensor, "reduce_scatter_tensor input")
        dst = T.Staged(output_tensor, "reduce_scatter_tensor output", copy_in=False)
        if dst.tensor.dtype != src.tensor.dtype or src.tensor.numel() != self._size * dst.tensor.numel():
            raise ValueError(f"reduce_scatter_tensor: the input must have world_size ({self._size}) x the output's "
                             f"elements and the same dtype; got {src.tensor.numel()} {src.tensor.dtype} for an "
                             f"output of {dst.tensor.numel()} {dst.tensor.dtype}")
        x = src.array.reshape(-1)
        if factor is not None:
            T.check_premul(factor, src.tensor, "reduce_scatter_tensor input")
            scaled = src.work.detach().reshape(-1) * factor
            x, op = T.as_numpy(scaled), "sum"
        elif np.may_share_memory(x, dst.array):
            x = x.copy()
        return self._issue("reduce_scatter_tensor", [(self._comm().reduce_scatter, (x,),
                                                      {"out": dst.array.reshape(-1), "op": op})],
                           opts, dst.done, [output_tensor])

    def reduce_scatter_single_coalesced(self, output_tensors, input_tensors, opts=None):
        """reduce_scatter_tensor_coalesced (FSDP2, the coalescing manager): tensors of one dtype go in one library
        call, each rank's blocks laid side by side (rank r's part of every input, then rank r+1's, ...)."""
        op, factor = T.reduce_op(opts)
        if len(output_tensors) != len(input_tensors):
            raise ValueError("reduce_scatter_tensor_coalesced: one output per input")
        if len({t.dtype for t in input_tensors}) > 1 or len(input_tensors) < 2:
            works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(output_tensors, input_tensors,
                                                                          strict=True)]
            return GroupWork(works, list(output_tensors))
        p = self._size
        for o, i in zip(output_tensors, input_tensors, strict=True):
            T.check(o, "reduce_scatter_tensor_coalesced output")
            T.check(i, "reduce_scatter_tensor_coalesced input")
            if o.dtype != i.dtype or i.numel() != p * o.numel():
                raise ValueError(f"reduce_scatter_tensor_coalesced: each input must have world_size ({p}) x its "
                                 f"output's elements and dtype; got {i.numel()} {i.dtype} for {o.numel()} {o.dtype}")
        sizes = [o.numel() for o in output_tensors]
        packed = torch.cat([T.flat(i).view(p, -1) for i in input_tensors], dim=1).reshape(-1)
        if factor is not None:
            T.check_premul(factor, input_tensors[0], "reduce_scatter_tensor_coalesced input")
            packed.mul_(factor)
            op = "sum"
        mine = torch.empty(sum(sizes), dtype=packed.dtype)

        def finish():
            for o, part in zip(output_tensors, mine.split(sizes), strict=True):
                T.copy_into(o, part)
        return self._issue("reduce_scatter_tensor_coalesced",
                           [(self._comm().reduce_scatter, (T.as_numpy(packed),), {"out": T.as_numpy(mine),
                                                                                   "op": op})],
                           opts, finish, list(output_tensors))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- data movement --------------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        root = int(opts.rootRank) if opts is not None else 0
        staged = [T.Staged(t, "broadcast tensor") for t in tensors]
        calls = [(self._comm().broadcast, (s.array,), {"root": root}) for s in staged]
        return self._issue("broadcast", calls, opts, lambda: [s.done() for s in staged], list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        """all_gather: every rank's input into output_list[rank]. Sizes may differ between ranks (the outputs
        say each rank's size): inputs are padded to the largest, gathered, and the padding dropped."""
        if len(output_tensors) != len(input_tensors):
            raise ValueError("all_gather: one output list per input tensor")
        jobs = []
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            T.check(inp, "all_gather input")
            if len(outs) != self._size:
                raise ValueError(f"all_gather needs {self._size} output tensors (one per rank), got {len(outs)}")
            for o in outs:
                T.check(o, "all_gather output")
                if o.dtype != inp.dtype:
                    raise ValueError(f"all_gather outputs must have the input's dtype {inp.dtype}, got {o.dtype}")
            if outs[self._rank].numel() != inp.numel():
                raise ValueError(f"all_gather: output_list[{self._rank}] has {outs[self._rank].numel()} elements "
                                 f"but this rank's input has {inp.numel()}; output r must have rank r's size")
            width = max(o.numel() for o in outs)
            x = T.flat(inp)
            if x.numel() < width:
                x = torch.cat([x, x.new_zeros(width - x.numel())])
            buf = torch.empty(self._size * width, dtype=inp.dtype)
            jobs.append((outs, x, buf, width))
        calls = [(self._comm().allgather, (T.as_numpy(x),), {"out": T.as_numpy(buf)}) for _, x, buf, _ in jobs]

        def finish():
            for outs, _, buf, width in jobs:
                for k, o in enumerate(outs):
                    T.copy_into(o, buf[k * width:k * width + o.numel()])
        return self._issue("all_gather", calls, opts, finish, list(output_tensors))

    def _all_gather_single(self, output_tensor, input_tensor, opts=None):
        """all_gather_into_tensor's general path: the ranks' inputs concatenated in rank order."""
        src = T.Staged(input_tensor, "all_gather_into_tensor input")
        dst = T.Staged(output_tensor, "all_gather_into_tensor output", copy_in=False)
        if dst.tensor.dtype != src.tensor.dtype or dst.tensor.numel() != self._size * src.tensor.numel():
            raise ValueError(f"all_gather_into_tensor: the output must have world_size ({self._size}) x the input's "
                             f"elements and the same dtype; got {dst.tensor.numel()} {dst.tensor.dtype} for an input "
                             f"of {src.tensor.numel()} {src.tensor.dtype}")
        x = src.array.reshape(-1)
        out = dst.array.reshape(-1)
        if np.may_share_memory(x, out):  # the input is a chunk of the output (FSDP's habit)
            x = x.copy()
        return self._issue("all_gather_into_tensor", [(self._comm().allgather, (x,), {"out": out})], opts,
                           dst.done, [output_tensor])

    def all_gather_single_coalesced(self, output_tensors, input_tensors, opts=None):
        """all_gather_into_tensor_coalesced (FSDP2, DTensor, the coalescing manager): the inputs' bytes packed
        into one buffer, one library allgather, each rank's part unpacked into every output."""
        if len(output_tensors) != len(input_tensors):
            raise ValueError("all_gather_into_tensor_coalesced: one output per input")
        p = self._size
        for o, i in zip(output_tensors, input_tensors, strict=True):
            T.check(o, "all_gather_into_tensor_coalesced output")
            T.check(i, "all_gather_into_tensor_coalesced input")
            if o.dtype != i.dtype or o.numel() != p * i.numel():
                raise ValueError(f"all_gather_into_tensor_coalesced: each output must have world_size ({p}) x its "
                                 f"input's elements and dtype; got {o.numel()} {o.dtype} for {i.numel()} {i.dtype}")
        if not input_tensors:
            return CompletedWork([])
        sizes = [i.numel() * i.element_size() for i in input_tensors]
        packed = torch.cat([T.flat(i).view(torch.uint8) for i in input_tensors])
        gathered = torch.empty(p * packed.numel(), dtype=torch.uint8)

        def finish():
            rows = gathered.view(p, -1).split(sizes, dim=1)
            for o, part in zip(output_tensors, rows, strict=True):
                with torch.no_grad():
                    T.flat(o).view(torch.uint8).view(p, -1).copy_(part) if o.is_contiguous() else \
                        o.copy_(part.contiguous().view(o.dtype).view(o.shape))
        return self._issue("all_gather_into_tensor_coalesced",
                           [(self._comm().allgather, (T.as_bytes(packed),), {"out": T.as_bytes(gathered)})],
                           opts, finish, list(output_tensors))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """all_gather_coalesced: output_lists[r][i] gets rank r's input i; one library call for all inputs."""
        p = self._size
        if len(output_lists) != p:
            raise ValueError(f"all_gather_coalesced needs {p} output lists (one per rank), got {len(output_lists)}")
        for i in input_tensors:
            T.check(i, "all_gather_coalesced input")
        for outs in output_lists:
            if len(outs) != len(input_tensors):
                raise ValueError(f"all_gather_coalesced: each output list needs {len(input_tensors)} tensors (one "
                                 f"per input), got {len(outs)}")
            for o, i in zip(outs, input_tensors, strict=True):
                T.check(o, "all_gather_coalesced output")
                if o.dtype != i.dtype or o.numel() != i.numel():
                    raise ValueError("all_gather_coalesced: every output must have its input's dtype and size")
        if not input_tensors:
            return CompletedWork(list(output_lists))
        sizes = [i.numel() * i.element_size() for i in input_tensors]
        packed = torch.cat([T.flat(i).view(torch.uint8) for i in input_tensors])
        gathered = torch.empty(p * packed.numel(), dtype=torch.uint8)

        def finish():
            for r, outs in enumerate(output_lists):
                parts = gathered[r * packed.numel():(r + 1) * packed.numel()].split(sizes)
                for o, part in zip(outs, parts, strict=True):
                    T.copy_into(o, part.view(o.dtype))
        return self._issue("all_gather_coalesced",
                           [(self._comm().allgather, (T.as_bytes(packed),), {"out": T.as_bytes(gathered)})],
                           opts, finish, list(output_lists))

    def gather(self, output_tensors, input_tensors, opts=None):
        """gather: the root's output_tensors[0] is a list of p tensors, filled in rank order. The library's gather
        moves bytes (MPI's own, which takes no bfloat16 buffer)."""
        root = int(opts.rootRank) if opts is not None else 0
        if len(input_tensors) != 1:
            raise ValueError(f"gather takes one input tensor per rank, got {len(input_tensors)}")
        inp = input_tensors[0]
        T.check(inp, "gather input")
        x = T.as_bytes(T.flat(inp))
        buf = None
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise ValueError(f"gather: the root needs a list of {self._size} output tensors")
            for o in output_tensors[0]:
                T.check(o, "gather output")
                if o.dtype != inp.dtype or o.numel() != inp.numel():
                    raise ValueError("gather outputs must have the input's dtype and size")
            buf = torch.empty(self._size * inp.numel(), dtype=inp.dtype)
        elif output_tensors and any(len(o) for o in output_tensors):
            raise ValueError(f"gather: only the root (rank {root}) takes output tensors")

        def finish():
            if buf is not None:
                for k, o in enumerate(output_tensors[0]):
                    T.copy_into(o, buf[k * inp.numel():(k + 1) * inp.numel()])
        kwargs = {"out": None if buf is None else T.as_bytes(buf), "root": root}
        return self._issue("gather", [(self._comm().gather, (x,), kwargs)], opts, finish, list(output_tensors))

    def scatter(self, output_tensors, input_tensors, opts=None):
        """scatter: the root's input_tensors[0] is a list of p tensors; rank r gets the r-th (bytes, as gather)."""
        root = int(opts.rootRank) if opts is not None else 0
        if len(output_tensors) != 1:
            raise ValueError(f"scatter takes one output tensor per rank, got {len(output_tensors)}")
        T.check(output_tensors[0], "scatter output")
        out = output_tensors[0]
        n = out.numel()
        block = torch.empty(n, dtype=out.dtype)
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise ValueError(f"scatter: the root needs a list of {self._size} input tensors")
            for t in input_tensors[0]:
                T.check(t, "scatter input")
                if t.dtype != out.dtype or t.numel() != n:
                    raise ValueError("scatter inputs must have the output's dtype and size")
            x = T.as_bytes(torch.cat([T.flat(t) for t in input_tensors[0]]))
        else:
            if input_tensors and any(len(i) for i in input_tensors):
                raise ValueError(f"scatter: only the root (rank {root}) takes input tensors")
            x = None
        kwargs = {"out": T.as_bytes(block), "root": root}
        return self._issue("scatter", [(self._comm().scatter, (x,), kwargs)], opts,
                           lambda: T.copy_into(out, block), list(output_tensors))

    def _all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single's general path: split sizes count rows of dim 0 (empty: even splits)."""
        src = T.Staged(input, "all_to_all_single input")
        dst = T.Staged(output, "all_to_all_single output", copy_in=False)
        p = self._size
        if src.tensor.dtype != dst.tensor.dtype:
            raise ValueError(f"all_to_all_single: input {src.tensor.dtype} and output {dst.tensor.dtype} differ")
        x, out = src.array.reshape(-1), dst.array.reshape(-1)
        if np.may_share_memory(x, out):
            x = x.copy()
        if not output_split_sizes and not input_split_sizes:
            if x.size % p or out.size != x.size:
                raise ValueError(f"all_to_all_single with even splits needs input and output of the same size, a "
                                 f"multiple of world_size ({p}); got {x.size} and {out.size} elements")
            call = (self._comm().alltoall, (x,), {"out": out})
        else:
            sends = _split_counts(input_split_sizes, src.tensor, p, "input")
            recvs = _split_counts(output_split_sizes, dst.tensor, p, "output")
            call = (self._comm().alltoallv, (x, sends, recvs), {"out": out})
        return self._issue("all_to_all_single", [call], opts, dst.done, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all: input_tensors[d] goes to rank d, output_tensors[s] comes from rank s (sizes may differ)."""
        p = self._size
        if len(output_tensors) != p or len(input_tensors) != p:
            raise ValueError(f"all_to_all needs {p} input and {p} output tensors, got {len(input_tensors)} and "
                             f"{len(output_tensors)}")
        for t in (*input_tensors, *output_tensors):
            T.check(t, "all_to_all tensor")
        if len({t.dtype for t in (*input_tensors, *output_tensors)}) > 1:
            raise ValueError("all_to_all: every input and output tensor must have the same dtype")
        x = torch.cat([T.flat(t) for t in input_tensors])
        out = torch.empty(sum(t.numel() for t in output_tensors), dtype=x.dtype)
        sends = [t.numel() for t in input_tensors]
        recvs = [t.numel() for t in output_tensors]
        if len(set(sends)) == 1 and len(set(recvs)) == 1 and sends == recvs:
            call = (self._comm().alltoall, (T.as_numpy(x),), {"out": T.as_numpy(out)})
        else:
            call = (self._comm().alltoallv, (T.as_numpy(x), sends, recvs), {"out": T.as_numpy(out)})

        def finish():
            offset = 0
            for t in output_tensors:
                T.copy_into(t, out[offset:offset + t.numel()])
                offset += t.numel()
        return self._issue("all_to_all", [call], opts, finish, list(output_tensors))

    # -- synchronisation ------------------------------------------------------------------------------
    def barrier(self, opts=None):
        return self._issue("barrier", [(self._comm().barrier, (), {})], opts)

    # -- the coalescing manager (torch.distributed.distributed_c10d._coalescing_manager with a device) ----------
    def _start_coalescing(self, device=None) -> None:
        if self._coalesced is not None:
            raise RuntimeError("backend 'collectives': _start_coalescing called twice without _end_coalescing")
        self._coalesced = []

    def _end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return GroupWork(works)

    # -- end of life ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Finish pending calls and free the communicator (torch calls this from destroy_process_group)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            with LOCK:
                comm.close()

    abort = shutdown


def _split_counts(splits, t: torch.Tensor, p: int, what: str) -> list[int]:
    """Element counts of all_to_all_single's split sizes (rows of dim 0; empty: even)."""
    rows = t.shape[0] if t.dim() else 1
    row = t.numel() // rows if rows else 0
    if not splits:
        if rows % p:
            raise ValueError(f"all_to_all_single: {what} has {rows} rows, not a multiple of world_size ({p}); pass "
                             f"{what}_split_sizes")
        return [rows // p * row] * p
    splits = [int(s) for s in splits]
    if len(splits) != p or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {what}_split_sizes must be {p} counts >= 0 adding up to the {rows} "
                         f"rows of dim 0, got {splits}")
    return [s * row for s in splits]


__all__ = ["BACKEND_NAME", "CollectivesProcessGroup", "MONITORED_BARRIER_TAG"]
