"""Keeps the worked example of docs/algorithms.md working, and the doc's code identical to the example file."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import numpy as np
import pytest

from collectives import algorithms, emulate, registry, verify

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ring_of_rings.py"
DOC = ROOT / "docs" / "algorithms.md"


@pytest.fixture(scope="module")
def example():
    """Import examples/ring_of_rings.py by path (it registers `ring_of_rings`); unregister afterwards."""
    registry._REGISTRY.pop("ring_of_rings", None)
    spec = importlib.util.spec_from_file_location("ring_of_rings_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    registry._REGISTRY.pop("ring_of_rings", None)


def build(p: int, g: int, count: int):
    return algorithms.build("ring_of_rings", collective="allreduce", world_size=p, count=count, group_size=g)


def test_registered(example):
    assert "ring_of_rings" in algorithms.names("allreduce")
    assert algorithms.info("ring_of_rings").builder is example.build_ring_of_rings


@pytest.mark.parametrize("p, g", [(1, 1), (2, 1), (2, 2), (4, 2), (6, 2), (6, 3), (8, 4), (9, 3), (12, 4),
                                  (12, 6), (15, 5), (16, 4), (16, 16), (32, 8)])
def test_verifies_with_ring_costs(example, p, g):
    G = p // g
    for count in sorted({0, 1, p - 1, 3 * p + 1, 4 * p}):
        rep = verify(build(p, g, count))
        steps = 2 * (g - 1) + 2 * (G - 1)
        assert rep.steps == steps and rep.messages == p * steps
    # a count that divides by p: every rank sends 2(p-1)/p of the buffer, the same total as a flat ring
    count = 4 * p
    rep = verify(build(p, g, count), itemsize=4)
    assert (rep.bytes_sent == 2 * (p - 1) * (count // p) * 4).all()
    assert (rep.bytes_received == rep.bytes_sent).all()


@pytest.mark.parametrize("p, g", [(1, 1), (4, 2), (6, 3), (8, 4), (12, 3), (10, 5)])
@pytest.mark.parametrize("count", [0, 1, 7, 50])
def test_emulates(example, p, g, count):
    rng = np.random.default_rng(p * 100 + g * 10 + count)
    ints = [rng.integers(-1000, 1000, size=count).astype(np.int64) for _ in range(p)]
    want = np.sum(ints, axis=0) if ints else None
    for out in emulate(build(p, g, count), ints):
        np.testing.assert_array_equal(out, want)
    floats = [rng.standard_normal(count).astype(np.float32) for _ in range(p)]
    outs = emulate(build(p, g, count), floats, op="avg")
    assert len({o.tobytes() for o in outs}) == 1  # bitwise identical on every rank
    exact = np.mean(np.stack(floats).astype(np.float64), axis=0)
    np.testing.assert_allclose(outs[0], exact, rtol=0, atol=4 * p * np.finfo(np.float32).eps * 4)


def test_world_size_must_divide(example):
    with pytest.raises(ValueError, match="needs world_size divisible by group_size: got world_size=6, group_size=4"):
        build(6, 4, 10)
    with pytest.raises(ValueError, match="divisible by group_size"):
        build(4, 0, 10)


def test_only_allreduce(example):
    with pytest.raises(ValueError, match="does not implement allgather"):
        algorithms.build("ring_of_rings", collective="allgather", world_size=4, count=4)


def test_doc_shows_the_example_code_verbatim(example):
    doc = DOC.read_text()
    for fn in (example.reduce_scatter_ring, example.allgather_ring, example.build_ring_of_rings):
        source = inspect.getsource(fn)
        assert source in doc, f"docs/algorithms.md is out of date: paste {fn.__name__} from {EXAMPLE.name} again"
