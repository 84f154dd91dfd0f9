"""The backend's pieces that need no MPI launch: reduce ops, argument checks, split sizes and the view cache."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'collectives[torch]')")
pytest.importorskip("mpi4py")

import torch.distributed as dist  # noqa: E402

from collectives.torch import tensors as T  # noqa: E402
from collectives.torch.process_group import _split_counts  # noqa: E402


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
