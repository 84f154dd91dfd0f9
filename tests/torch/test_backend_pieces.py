"""The backend's pieces that need no MPI launch: reduce ops, argument checks, split sizes, the view cache, and the
all_reduce fast path over a recording stand-in for the library's communicator."""

from __future__ import annotations

import gc
import types

import numpy as np
import pytest

# torch.distributed, not torch: without PyTorch, `import torch` finds tests/torch (this folder, a namespace package
# on the path pytest gives the tests) and the module would fail to import instead of skipping
dist = pytest.importorskip("torch.distributed", reason="PyTorch is not installed (pip install 'collectives[torch]')")
pytest.importorskip("mpi4py")

import torch  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

from collectives.torch import tensors as T  # noqa: E402
from collectives.torch.process_group import CollectivesProcessGroup, _split_counts  # noqa: E402
from collectives.torch.work import PENDING  # noqa: E402


def options(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


@pytest.mark.parametrize(("op", "name"), [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"),
                                          (dist.ReduceOp.PRODUCT, "prod"), (dist.ReduceOp.MIN, "min"),
                                          (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.BAND, "band"),
                                          (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor")])
def test_reduce_ops_map_to_the_library(op, name):
    assert T.reduce_op(options(op)) == (name, None)
    assert T.reduce_op(None) == ("sum", None)


def test_ops_by_hash_agree_with_reduce_op():
    # torch's ReduceOp hashes to its op's value; if a torch stopped doing so the table would be empty (and every
    # all_reduce would take the slower general path): this test says so
    assert len(T.OPS_BY_HASH) == 8
    for kind, name in T.OPS.items():
        if name == "premul_sum":
            continue
        o = options(dist.ReduceOp(kind))
        assert T.OPS_BY_HASH[hash(o.reduceOp)] == T.reduce_op(o)[0] == name
    assert hash(options(dist._make_nccl_premul_sum(0.5)).reduceOp) not in T.OPS_BY_HASH


def test_premul_sum_carries_its_factor():
    assert T.reduce_op(options(dist._make_nccl_premul_sum(0.25))) == ("premul_sum", 0.25)
    factor = T.reduce_op(options(dist._make_nccl_premul_sum(torch.tensor([2.0]))))[1]
    assert isinstance(factor, torch.Tensor) and factor.item() == 2.0
    with pytest.raises(TypeError, match="PREMUL_SUM needs a floating dtype"):
        T.check_premul(2.0, torch.ones(2, dtype=torch.int32), "x")
    with pytest.raises(ValueError, match="one-element CPU tensor"):
        T.check_premul(torch.ones(2), torch.ones(2), "x")


def test_checks_name_what_is_wrong():
    with pytest.raises(TypeError, match="does not support dtype torch.bool"):
        T.check(torch.ones(2, dtype=torch.bool), "x")
    with pytest.raises(ValueError, match="works on CPU tensors; x is on meta"):
        T.check(torch.empty(2, device="meta"), "x")
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        T.check([1.0], "x")
    with pytest.raises(TypeError, match="dense tensors"):
        T.check(torch.eye(2).to_sparse(), "x")


def test_split_sizes_count_rows_and_are_checked():
    t = torch.empty(6, 3)
    assert _split_counts([1, 2, 3], t, 3, "input") == [3, 6, 9]
    assert _split_counts([], t, 3, "input") == [6, 6, 6]
    with pytest.raises(ValueError, match="input_split_sizes must be 3 counts >= 0 adding up to the 6 rows"):
        _split_counts([1, 1, 1], t, 3, "input")
    with pytest.raises(ValueError, match="not a multiple of world_size"):
        _split_counts([], torch.empty(5), 3, "output")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint16])
def test_view_cache_is_the_tensor_and_follows_it(dtype):
    views = T.Views()
    t = torch.arange(8).to(dtype)
    a = views.get(t)
    assert a.__array_interface__["data"][0] == t.data_ptr() and a.size == 8
    assert views.get(t) is a  # reused while the tensor is unchanged
    a[1] = 7
    assert t[1].item() == 7  # the same memory
    t.set_(torch.zeros(1000, dtype=dtype))  # new storage: a new view
    b = views.get(t)
    assert b is not a and b.size == 1000 and b.__array_interface__["data"][0] == t.data_ptr()


def test_view_cache_declines_what_the_general_path_must_check():
    views = T.Views()
    assert views.get(torch.ones(2, dtype=torch.bool)) is None
    assert views.get(torch.ones(2, dtype=torch.complex64)) is None
    assert views.get(torch.empty(2, device="meta")) is None
    assert views.get(torch.eye(2).to_sparse()) is None
    t = torch.ones(2)
    a = views.get(t)
    t.data = t.data.to(torch.int32)  # same object, new dtype: a new view
    b = views.get(t)
    assert b is not a and b.dtype == np.int32


def test_view_cache_never_hands_out_a_dead_tensors_view():
    views = T.Views()
    t = torch.zeros(4)
    old = views.get(t)
    key = id(t)
    del t
    gc.collect()
    u = torch.ones(4)
    got = views.get(u)
    assert got.__array_interface__["data"][0] == u.data_ptr()
    assert id(u) != key or got is not old
    np.testing.assert_array_equal(got, np.ones(4, np.float32))


class Handle:
    """A library handle that is complete."""

    def test(self) -> bool:
        return True

    def wait(self, timeout=None) -> None:
        pass


class RecordingComm:
    """Stands in for the library's Communicator: records each call (and does what a world of one would)."""

    rank = 0

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self.calls = []
        self.bound = 0  # persistent calls made

    def _record(self, name, a, out, op, async_op):
        self.calls.append((a, out, op, async_op, name))
        if out is not None and out is not a and out.size == a.size:
            out.reshape(-1)[...] = a.reshape(-1)
        return Handle() if async_op else out

    def allreduce(self, a, out=None, op="sum", async_op=False):
        return self._record("allreduce", a, out, op, async_op)

    def allgather(self, a, out=None, async_op=False):
        return self._record("allgather", a, out, None, async_op)

    def reduce_scatter(self, a, out=None, op="sum", async_op=False):
        return self._record("reduce_scatter", a, out, op, async_op)

    def alltoall(self, a, out=None, async_op=False):
        return self._record("alltoall", a, out, None, async_op)

    def alltoallv(self, a, sends, recvs, out=None, async_op=False):
        return self._record("alltoallv", a, out, None, async_op)

    def persistent(self, collective, a, out=None, op="sum"):
        """A bound call whose runs are recorded as the method's calls (the backend binds its blocking calls)."""
        self.bound += 1
        takes_op = collective in ("allreduce", "reduce_scatter")
        return types.SimpleNamespace(
            run=lambda timeout=None: self._record(collective, a, out, op if takes_op else None, False))


def blocking(op=dist.ReduceOp.SUM):
    o = options(op)
    o.asyncOp = False
    return o


def test_all_reduce_fast_path_hands_the_library_the_tensor_itself():
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    t = torch.arange(4, dtype=torch.float32)
    for op, name in [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.AVG, "avg")]:
        work = group.allreduce([t], blocking(op))
        assert work.wait() and work.is_completed()
        a, out, got, async_op, _ = comm.calls[-1]
        assert out is a and got == name and not async_op
        assert a.__array_interface__["data"][0] == t.data_ptr() and a.size == 4
    assert comm.bound == 3  # a persistent call per tensor and op, reused while both stay the same:
    group.allreduce([t], blocking(dist.ReduceOp.AVG))
    assert comm.bound == 3 and len(comm.calls) == 4 and comm.calls[-1][2] == "avg"
    t.resize_(2)  # the same tensor, resized: a new bound call over its new extent
    group.allreduce([t], blocking(dist.ReduceOp.AVG))
    assert comm.bound == 4 and comm.calls[-1][0].size == 2


def test_all_reduce_fast_path_still_refuses_bad_tensors_before_calling():
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    with pytest.raises(TypeError, match="does not support dtype torch.bool"):
        group.allreduce([torch.ones(2, dtype=torch.bool)], blocking())
    with pytest.raises(ValueError, match="works on CPU tensors"):
        group.allreduce([torch.empty(2, device="meta")], blocking())
    t = torch.ones(2)
    group.allreduce([t], blocking())  # cached view
    t.data = torch.ones(2, dtype=torch.bool)  # the same tensor object, now of an unsupported dtype
    with pytest.raises(TypeError, match="does not support dtype torch.bool"):
        group.allreduce([t], blocking())
    assert len(comm.calls) == 1


def test_all_reduce_general_path_stages_strided_tensors_and_scales_premul_sum():
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    t = torch.arange(8, dtype=torch.float32).view(2, 4).t()  # not contiguous: staged in a copy, written back
    group.allreduce([t], blocking())
    assert comm.calls[-1][0].flags.c_contiguous and comm.calls[-1][0].__array_interface__["data"][0] != t.data_ptr()
    u = torch.ones(3)
    group.allreduce([u], blocking(dist._make_nccl_premul_sum(0.5)))
    assert comm.calls[-1][2] == "sum" and u.tolist() == [0.5, 0.5, 0.5]


def address(a) -> int:
    return a.__array_interface__["data"][0]


def test_fast_paths_of_input_output_calls_take_the_tensors_themselves():
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    x, y = torch.arange(6, dtype=torch.float32), torch.zeros(6)
    o = c10d.AllgatherOptions()
    o.asyncOp = False
    group.all_gather_single(y, x, o)
    r = c10d.ReduceScatterOptions()
    r.reduceOp, r.asyncOp = dist.ReduceOp.MIN, False
    group.reduce_scatter_single(y, x, r)
    a = c10d.AllToAllOptions()
    a.asyncOp = False
    group.all_to_all_single(y, x, [], [], a)
    assert [c[4] for c in comm.calls] == ["allgather", "reduce_scatter", "alltoall"]
    assert all(address(c[0]) == x.data_ptr() and address(c[1]) == y.data_ptr() for c in comm.calls)
    assert not any(holds_a_tensor(c[0]) or holds_a_tensor(c[1]) for c in comm.calls)  # the cached views
    assert comm.calls[1][2] == "min" and y.tolist() == x.tolist()
    assert comm.bound == 3
    group.all_gather_single(y, x, o)  # the same pair: its bound call again
    assert comm.bound == 3 and comm.calls[-1][4] == "allgather"
    r.reduceOp = dist.ReduceOp.MAX  # another op: another bound call
    group.reduce_scatter_single(y, x, r)
    assert comm.bound == 4 and comm.calls[-1][2] == "max"
    group.all_gather_single(torch.zeros(6), x, o)  # another output tensor: another bound call
    assert comm.bound == 5


def test_input_output_calls_leave_the_fast_path_for_what_it_does_not_take():
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    o = c10d.AllgatherOptions()
    o.asyncOp = False
    y = torch.arange(4, dtype=torch.float32)
    group.all_gather_single(y, y, o)  # the input is the output: the general path reads a copy
    assert address(comm.calls[-1][0]) != y.data_ptr() and address(comm.calls[-1][1]) == y.data_ptr()
    with pytest.raises(ValueError, match="all_gather_into_tensor: the output must have world_size"):
        group.all_gather_single(torch.zeros(3), torch.ones(2), o)
    with pytest.raises(ValueError, match="all_gather_into_tensor: the output must have world_size"):
        group.all_gather_single(torch.zeros(2, dtype=torch.float64), torch.ones(2), o)
    with pytest.raises(TypeError, match="does not support dtype torch.bool"):
        group.all_gather_single(torch.zeros(2, dtype=torch.bool), torch.ones(2, dtype=torch.bool), o)
    r = c10d.ReduceScatterOptions()
    r.reduceOp, r.asyncOp = dist._make_nccl_premul_sum(2.0), False
    out = torch.zeros(2)
    group.reduce_scatter_single(out, torch.ones(2), r)  # PREMUL_SUM: the general path scales a copy
    assert comm.calls[-1][2] == "sum" and out.tolist() == [2.0, 2.0]
    a = c10d.AllToAllOptions()
    a.asyncOp = False
    group.all_to_all_single(out, torch.ones(2), [2], [2], a)  # split sizes: the general path
    assert comm.calls[-1][4] == "alltoallv"
    assert len(comm.calls) == 3


def test_fast_paths_issue_async_and_coalesced_calls_as_works():
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    t = torch.ones(2)
    o = options(dist.ReduceOp.SUM)
    o.asyncOp = True
    work = group.allreduce([t], o)
    assert comm.calls[-1][3] is True and work is not group._done
    assert work.wait() and work.result() == [t]
    group._start_coalescing()
    first = group.allreduce([t], blocking())  # inside a coalescing block even a blocking call is collected
    second = group.all_gather_single(torch.zeros(2), torch.ones(2), c10d.AllgatherOptions())
    joined = group._end_coalescing()
    assert comm.calls[-2][3] is True and comm.calls[-1][3] is True
    assert joined._works == [first, second] and joined.wait()


def holds_a_tensor(a) -> bool:
    """The array's base chain ends in a torch tensor (which keeps the memory alive), not in a bare buffer."""
    while a is not None and not isinstance(a, torch.Tensor):
        a = getattr(a, "base", None)
    return a is not None


def test_calls_left_in_flight_hold_their_tensors_memory():
    # the cached views do not own the memory: an asynchronous call must hand the library arrays that do, or a
    # caller that drops its tensors (a temporary input, an unwatched Work) leaves the library writing freed memory
    comm = RecordingComm()
    group = CollectivesProcessGroup(comm, 0, 1)
    t, x, y = torch.ones(4), torch.ones(4), torch.zeros(4)
    group.allreduce([t], blocking())
    assert not holds_a_tensor(comm.calls[0][0])  # blocking: the cached view, the caller holds the tensor
    gather = c10d.AllgatherOptions()
    assert gather.asyncOp  # torch's default
    works = [group.all_gather_single(y, x, gather)]
    o = options(dist.ReduceOp.SUM)
    o.asyncOp = True
    works.append(group.allreduce([t], o))
    assert [c[4] for c in comm.calls] == ["allreduce", "allgather", "allreduce"]
    assert all(holds_a_tensor(c[0]) and holds_a_tensor(c[1]) for c in comm.calls[1:])
    assert all(w.wait() for w in works)  # completed: no call left in flight for the tests after this one


@pytest.mark.parametrize("p", [2, 3])
def test_fast_paths_take_calls_between_ranks(p):
    """all_gather's output and reduce_scatter's input are world_size times the other tensor."""
    assert not PENDING.count  # a call in flight anywhere would send every call down the general path
    comm = RecordingComm(p)
    group = CollectivesProcessGroup(comm, 0, p)
    small, big = torch.ones(2), torch.zeros(2 * p)
    o = c10d.AllgatherOptions()
    o.asyncOp = False
    group.all_gather_single(big, small, o)
    r = c10d.ReduceScatterOptions()
    r.asyncOp = False
    group.reduce_scatter_single(small, big, r)
    a = c10d.AllToAllOptions()
    a.asyncOp = False
    group.all_to_all_single(torch.zeros(2 * p), big, [], [], a)
    assert [c[4] for c in comm.calls] == ["allgather", "reduce_scatter", "alltoall"]
    assert address(comm.calls[0][0]) == small.data_ptr() and address(comm.calls[0][1]) == big.data_ptr()
    assert address(comm.calls[1][0]) == big.data_ptr() and address(comm.calls[1][1]) == small.data_ptr()
    assert address(comm.calls[2][0]) == big.data_ptr()
    assert not any(holds_a_tensor(c[0]) or holds_a_tensor(c[1]) for c in comm.calls)  # the cached views: fast paths
    with pytest.raises(ValueError, match=f"world_size \\({p}\\)"):
        group.all_gather_single(torch.zeros(2), small, o)
    with pytest.raises(ValueError, match=f"world_size \\({p}\\)"):
        group.reduce_scatter_single(small, torch.zeros(2), r)
    assert len(comm.calls) == 3
