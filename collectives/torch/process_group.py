"""A torch.distributed ProcessGroup (Python subclass) that runs the library's collectives on CPU tensors.

Each call converts the tensors to zero-copy numpy views (bfloat16 through an int16 view reinterpreted as
ml_dtypes.bfloat16: 16-bit types go through the library's own kernels, never through float32 copies unless
COLLECTIVES_ACCUMULATE=float32 asks for it), runs the collective on a `collectives.Communicator` and returns a
completed Work whose future holds the list of output tensors (what DDP expects).

Calls complete before they return, also with async_op=True: the library makes progress only when the caller
enters the communicator (it has no progress thread), and torch's futures (DDP waits on them from C++) cannot
drive it. A failure of the library (timeout, dead peer, ranks issuing different calls) is stored in the Work:
`work.wait()` raises it (for async_op=False torch calls wait() itself, so the call raises it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist

BACKEND_NAME = "collectives"

_DTYPES = {
    torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16, torch.float32: np.float32,
    torch.float64: np.float64, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
    torch.int64: np.int64, torch.uint8: np.uint8, torch.uint16: np.uint16, torch.uint32: np.uint32,
    torch.uint64: np.uint64,
}
SUPPORTED_DTYPES = tuple(_DTYPES)

_OPS = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
}


def _op_name(opts) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM
    kind = getattr(op, "op", op)  # a ReduceOp instance carries its RedOpType in .op
    for red, name in _OPS.items():
        if kind == red:
            return name
    raise ValueError(f"backend 'collectives' does not support reduce op {kind}; supported: SUM, AVG, PRODUCT, "
                     "MIN, MAX")


def _root(opts) -> int:
    return int(getattr(opts, "rootRank", 0)) if opts is not None else 0


def _check(t: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"backend 'collectives' works on CPU tensors; {what} is on {t.device}")
    if t.dtype not in _DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        raise TypeError(f"backend 'collectives' does not support dtype {t.dtype} ({what}); supported: {names}")
    if t.is_sparse or t.is_complex():
        raise TypeError(f"backend 'collectives' needs dense real tensors ({what})")


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a contiguous CPU tensor (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class _Staged:
    """A tensor's contiguous stand-in: the tensor itself when contiguous, else a copy written back by `done`."""

    def __init__(self, t: torch.Tensor, what: str, *, copy_in: bool = True) -> None:
        _check(t, what)
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


class CompletedWork(dist._Work):
    """A finished call: `get_future()` holds the output tensors, `wait()` raises the call's error, if any."""

    def __init__(self, result, error: BaseException | None = None) -> None:
        super().__init__()
        self._result = result
        self._error = error
        self._future = torch.futures.Future()
        if error is None:
            self._future.set_result(result)
        else:
            self._future.set_exception(error)

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - already complete
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self):
        return self._result

    def synchronize(self) -> None:
        pass


class CollectivesProcessGroup(dist.ProcessGroup):
    """torch.distributed process group over a `collectives.Communicator` (ranks = the communicator's ranks)."""

    def __init__(self, comm, rank: int, size: int) -> None:
        super().__init__(rank, size)
        if comm.rank != rank or comm.size != size:
            raise ValueError(
                f"backend 'collectives': torch gave rank {rank} of {size}, but the MPI communicator has rank "
                f"{comm.rank} of {comm.size}; under mpiexec pass rank/world_size from MPI (or use "
                "collectives.torch.init_process_group(), which does)")
        self.comm = comm
        self._rank = rank
        self._size = size

    # -- identity -------------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    def __repr__(self) -> str:
        return f"CollectivesProcessGroup(rank={self._rank}, size={self._size})"

    # -- helpers --------------------------------------------------------------------------------------
    def _run(self, result, body) -> CompletedWork:
        """Run `body()` (the library calls); its failure goes into the Work, raised by wait()."""
        try:
            body()
        except Exception as exc:  # noqa: BLE001 - handed to the caller through Work.wait()
            return CompletedWork(result, exc)
        return CompletedWork(result)

    # -- collectives ----------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _op_name(opts)
        staged = [_Staged(t, "allreduce tensor") for t in tensors]

        def body():
            for s in staged:
                self.comm.allreduce(s.array, out=s.array, op=op)
                s.done()
        return self._run(list(tensors), body)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = _root(opts)
        staged = [_Staged(t, "broadcast tensor") for t in tensors]

        def body():
            for s in staged:
                self.comm.broadcast(s.array, root=root)
                s.done()
        return self._run(list(tensors), body)

    def reduce(self, tensors, opts=None):
        op, root = _op_name(opts), _root(opts)
        staged = [_Staged(t, "reduce tensor") for t in tensors]

        def body():
            for s in staged:
                self.comm.reduce(s.array, out=s.array, root=root, op=op)
                if self._rank == root:
                    s.done()
        return self._run(list(tensors), body)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != len(input_tensors):
            raise ValueError("allgather: one output list per input tensor")
        jobs = []
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            src = _Staged(inp, "all_gather input")
            if len(outs) != self._size:
                raise ValueError(f"all_gather needs {self._size} output tensors (one per rank), got {len(outs)}")
            for o in outs:
                _check(o, "all_gather output")
                if o.dtype != inp.dtype or o.numel() != inp.numel():
                    raise ValueError("all_gather outputs must have the input's dtype and size (uneven sizes are "
                                     "not supported)")
            jobs.append((src, outs))

        def body():
            for src, outs in jobs:
                n = src.tensor.numel()
                buf = torch.empty(self._size * n, dtype=src.tensor.dtype)
                self.comm.allgather(src.array.reshape(-1), out=as_numpy(buf))
                with torch.no_grad():
                    for k, o in enumerate(outs):
                        o.copy_(buf[k * n:(k + 1) * n].view(o.shape))
        return self._run(list(output_tensors), body)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        """all_gather_into_tensor: output holds the ranks' inputs concatenated in rank order."""
        src = _Staged(input_tensor, "all_gather_into_tensor input")
        dst = _Staged(output_tensor, "all_gather_into_tensor output", copy_in=False)
        if dst.tensor.dtype != src.tensor.dtype or dst.tensor.numel() != self._size * src.tensor.numel():
            raise ValueError(f"all_gather_into_tensor: output must have world_size ({self._size}) x the input's "
                             f"elements and the same dtype; got {dst.tensor.numel()} vs {src.tensor.numel()}")

        def body():
            x = src.array.reshape(-1)
            out = dst.array.reshape(-1)
            if np.may_share_memory(x, out):  # input is a chunk of the output (FSDP's habit)
                x = x.copy()
            self.comm.allgather(x, out=out)
            dst.done()
        return self._run([output_tensor], body)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(output_tensors, input_tensors, strict=True)]
        return self._merge(works, list(output_tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op_name(opts)
        jobs = []
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            dst = _Staged(out, "reduce_scatter output", copy_in=False)
            if len(ins) != self._size:
                raise ValueError(f"reduce_scatter needs {self._size} input tensors (one per rank), got {len(ins)}")
            for t in ins:
                _check(t, "reduce_scatter input")
                if t.dtype != out.dtype or t.numel() != out.numel():
                    raise ValueError("reduce_scatter inputs must have the output's dtype and size")
            jobs.append((dst, ins))

        def body():
            for dst, ins in jobs:
                flat = torch.cat([t.detach().reshape(-1) for t in ins])
                self.comm.reduce_scatter(as_numpy(flat), out=dst.array.reshape(-1), op=op)
                dst.done()
        return self._run(list(output_tensors), body)

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        """reduce_scatter_tensor: rank r gets block r of the reduced input (world_size x output elements)."""
        op = _op_name(opts)
        src = _Staged(input_tensor, "reduce_scatter_tensor input")
        dst = _Staged(output_tensor, "reduce_scatter_tensor output", copy_in=False)
        if dst.tensor.dtype != src.tensor.dtype or src.tensor.numel() != self._size * dst.tensor.numel():
            raise ValueError(f"reduce_scatter_tensor: input must have world_size ({self._size}) x the output's "
                             f"elements and the same dtype; got {src.tensor.numel()} vs {dst.tensor.numel()}")

        def body():
            x = src.array.reshape(-1)
            out = dst.array.reshape(-1)
            if np.may_share_memory(x, out):
                x = x.copy()
            self.comm.reduce_scatter(x, out=out, op=op)
            dst.done()
        return self._run([output_tensor], body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(output_tensors, input_tensors, strict=True)]
        return self._merge(works, list(output_tensors))

    def barrier(self, opts=None):
        return self._run([], self.comm.barrier)

    @staticmethod
    def _merge(works: list[CompletedWork], result) -> CompletedWork:
        for w in works:
            if w.exception() is not None:
                return CompletedWork(result, w.exception())
        return CompletedWork(result)

    def shutdown(self) -> None:
        """Finish pending calls and free the communicator (torch calls this from destroy_process_group)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.close()

    abort = shutdown


# -- the backend creator ------------------------------------------------------------------------------
@dataclass
class Options:
    """Library options for a group: `dist.init_process_group("collectives", pg_options=Options(...))` or
    `dist.new_group(ranks, pg_options=Options(...))` (a sub-group without options inherits the default group's).
    None means the library's default (and its environment variables, e.g. COLLECTIVES_ACCUMULATE)."""

    accumulate: str | None = None  # "float32": 16-bit float sums carried in float32, rounded once
    deterministic: bool | None = None  # True: fixed rank-order reductions (algorithm 'direct')
    check: str | None = None  # call agreement: "metadata" (default), "full", "off"
    ranks_per_domain: int | None = None  # scale-up domain size for hierarchical algorithms (default: per host)


_group_base = None  # a Dup of the default group's MPI communicator: sub-groups are cut from it
_default_options = Options()


def _seconds(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def create_process_group(dist_opts, backend_options=None) -> CollectivesProcessGroup:
    """Backend creator (torch's extended API): the default group over the MPI world (minus switch daemons);
    a sub-group over the default group's ranks `global_ranks_in_group`, cut with MPI_Comm_create_group."""
    global _group_base, _default_options
    import collectives

    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = _seconds(dist_opts.timeout)
    ranks = list(dist_opts.global_ranks_in_group)
    if backend_options is not None and not isinstance(backend_options, Options):
        raise TypeError(f"backend 'collectives' takes pg_options=collectives.torch.Options(...), got "
                        f"{type(backend_options).__name__}")
    if not ranks:  # the default group
        options = backend_options or Options()
        comm = collectives.init(timeout=timeout, **asdict(options))
        if comm.rank != rank or comm.size != size:
            comm.close()
            raise ValueError(
                f"backend 'collectives': init_process_group got rank {rank}, world_size {size}, but MPI has rank "
                f"{comm.rank} of {comm.size}; start the job with mpiexec and pass the MPI rank and size (or call "
                "collectives.torch.init_process_group(), which does)")
        if _group_base is not None:
            _group_base.Free()
        _group_base = comm.mpi_comm.Dup()
        _default_options = options
        return CollectivesProcessGroup(comm, rank, size)
    if _group_base is None:
        raise RuntimeError("backend 'collectives': a sub-group needs the default group to use backend "
                           "'collectives' too")
    group = _group_base.Get_group().Incl(ranks)
    try:
        sub = _group_base.Create_group(group)
    finally:
        group.Free()
    try:
        comm = collectives.init(sub, timeout=timeout, **asdict(backend_options or _default_options))
    finally:
        sub.Free()
    return CollectivesProcessGroup(comm, rank, size)
