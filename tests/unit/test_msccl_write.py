"""Writing MSCCL-IR: read(write(s)) verifies, emulates bitwise like s and simulates within 1% of s for every
registered algorithm and collective at several world sizes; the files keep the executor's rules; refusals."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from collectives import algorithms, emulate, msccl, verify
from collectives.msccl.fileformat import MAX_TBS_PER_CHANNEL
from collectives.simulate import simulate
from collectives.topology import cluster, fully_connected

ROOTED = ("broadcast", "reduce")
SWITCHES = ("nvls", "sharp")  # in-network reduction: no MSCCL-IR for switch nodes


def build(name, collective, p, count, topology=None, **params):
    root = p - 1 if collective in ROOTED else None
    return algorithms.build(name, collective=collective, world_size=p, count=count, root=root, topology=topology,
                            **params)


def count_for(collective: str, p: int) -> int:
    return {"reduce_scatter": 3 * p, "alltoall": 3 * p, "allgather": 3}.get(collective, 3 * p + 1)


def round_trip(s, topology, **write_args) -> None:
    text = msccl.write(s, **write_args)
    back = msccl.read(text, count=s.count)
    verify(back)
    rng = np.random.default_rng(s.world_size)
    inputs = [rng.standard_normal(s.count).astype(np.float32) for _ in range(s.world_size)]
    for r, (a, b) in enumerate(zip(emulate(s, inputs), emulate(back, inputs), strict=True)):
        assert (a is None and b is None) or a.tobytes() == b.tobytes(), f"{s.algorithm} rank {r}"
    t, t_back = simulate(s, topology, mode="event").time, simulate(back, topology, mode="event").time
    assert t_back == pytest.approx(t, rel=0.01), s.algorithm


CASES = [(name, coll) for name in algorithms.names() for coll in algorithms.info(name).collectives
         if not algorithms.info(name).needs_topology and name not in SWITCHES and coll != "alltoallv"]


@pytest.mark.parametrize("name, collective", CASES)
def test_round_trip_every_flat_algorithm(name, collective):
    for p in (2, 3, 5):
        round_trip(build(name, collective, p, count_for(collective, p)), fully_connected(p))


@pytest.mark.parametrize("domains, gpus", [(2, 2), (2, 3)])
def test_round_trip_on_clusters(domains, gpus):
    topo = cluster(domains=domains, gpus_per_domain=gpus, radix=8)
    p = domains * gpus
    for coll in ("allreduce", "reduce_scatter", "allgather"):
        round_trip(build("hierarchical", coll, p, count_for(coll, p), topo, intra="ring", inter="ring"), topo)
    round_trip(build("hierarchical_alltoall", "alltoall", p, 3 * p, topo), topo)


def test_pipelined_out_of_place_and_channels():
    topo = fully_connected(7)
    round_trip(build("binomial", "allreduce", 7, 50, chunks=4), topo, inplace=False)
    round_trip(build("double_binary_tree", "allreduce", 7, 43, chunks=2), topo, channels=3, proto="LL")
    round_trip(build("bruck", "alltoall", 7, 21), topo, channels=2)


def elements(text: str):
    root = ET.fromstring(text)
    return root, root.findall("gpu"), [(g, tb, st) for g in root.findall("gpu") for tb in g.findall("tb")
                                       for st in tb.findall("step")]


def test_files_keep_the_executors_rules():
    s = build("direct", "allreduce", 6, 6)  # fused receives: staged into scratch, folded with re, nops
    text = msccl.write(s, channels=2, min_bytes=1024, max_bytes=1 << 20)
    assert " />" not in text  # the executor's tokenizer wants "/>"
    root, gpus, steps = elements(text)
    assert root.attrib == {"name": "direct allreduce p=6 chunks=1", "proto": "Simple", "nchannels": "2",
                           "nchunksperloop": "6", "ngpus": "6", "coll": "allreduce", "inplace": "1",
                           "outofplace": "0", "minBytes": "1024", "maxBytes": "1048576"}
    types = {st.get("type") for _, _, st in steps}
    assert {"s", "r", "cpy", "re", "nop"} <= types
    for g in gpus:
        assert set(g.attrib) == {"id", "i_chunks", "o_chunks", "s_chunks"} and int(g.get("s_chunks")) > 0
        tbs = g.findall("tb")
        assert [int(tb.get("id")) for tb in tbs] == list(range(len(tbs)))
        per_channel = {}
        for tb in tbs:
            per_channel[tb.get("chan")] = per_channel.get(tb.get("chan"), 0) + 1
            assert tb.get("send") != g.get("id") and tb.get("recv") != g.get("id")
            kids = tb.findall("step")
            assert [int(st.get("s")) for st in kids] == list(range(len(kids)))
            for i, st in enumerate(kids):
                assert set(st.attrib) == {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
                                          "hasdep"}
                assert 0 <= int(st.get("cnt")) < 72
                if st.get("type") == "nop":  # nops carry extra dependencies of the next real step, which has one
                    nxt = next(x for x in kids[i:] if x.get("type") != "nop")
                    assert int(nxt.get("depid")) >= 0
                if int(st.get("depid")) >= 0:  # a dependency names a signalling step
                    target = tbs[int(st.get("depid"))].findall("step")[int(st.get("deps"))]
                    assert target.get("hasdep") == "1" and target.get("type") != "nop"
        assert max(per_channel.values()) <= MAX_TBS_PER_CHANNEL and set(per_channel) == {"0", "1"}


def test_out_of_place_copies_in_and_out():
    s = build("ring", "reduce_scatter", 4, 8)
    text = msccl.write(s, inplace=False)
    root, _, steps = elements(text)
    assert root.get("inplace") == "0" and root.get("outofplace") == "1"
    copies = [st for _, _, st in steps if st.get("type") == "cpy" and int(st.get("cnt")) > 0]
    assert {(st.get("srcbuf"), st.get("dstbuf")) for st in copies} == {("i", "s"), ("s", "o")}
    assert not any(st.get("dstbuf") == "i" for _, _, st in steps)  # the caller's send buffer is left alone
    verify(msccl.read(text, count=8))


def test_refusals_say_why():
    with pytest.raises(ValueError, match="runs on switch nodes .* MSCCL-IR programs have GPUs only"):
        msccl.write(build("nvls", "allreduce", 8, 8, cluster(domains=1, gpus_per_domain=8, radix=8)))
    with pytest.raises(ValueError, match="MSCCL-IR cannot express alltoallv"):
        msccl.write(algorithms.build("pairwise", collective="alltoallv", world_size=2, counts=[[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match=f"GPU 0 needs 34 threadblocks on channel 0; the MSCCL executor allows "
                                         f"{MAX_TBS_PER_CHANNEL} per channel"):
        msccl.write(build("pairwise", "alltoall", 34, 34))
    msccl.write(build("pairwise", "alltoall", 34, 34), channels=2)  # peers spread over two channels
    with pytest.raises(ValueError, match=r"threadblock \(send 1, recv 4, channel 0\) needs 16 steps; the limit is 8"):
        msccl.write(build("ring", "allreduce", 5, 5), max_steps=8)
    with pytest.raises(ValueError, match="count must be > 0"):
        msccl.write(build("ring", "allreduce", 2, 0))
    with pytest.raises(ValueError, match="proto must be one of Simple, LL, LL128"):
        msccl.write(build("ring", "allreduce", 2, 2), proto="LL256")
    with pytest.raises(ValueError, match="channels must be an integer >= 1"):
        msccl.write(build("ring", "allreduce", 2, 2), channels=0)
    with pytest.raises(ValueError, match="need min_bytes <= max_bytes"):
        msccl.write(build("ring", "allreduce", 2, 2), min_bytes=10, max_bytes=5)


def test_export_picks_a_count_whose_chunks_scale():
    assert msccl.exact_count("ring", "allreduce", 5) == 5
    assert msccl.exact_count("ring", "allreduce", 4, chunks=3) == 12
    assert msccl.exact_count("ring", "allgather", 4) == 1
    text = msccl.export("binomial", 5, collective="broadcast", root=2)
    assert re.search(r'nchunksperloop="1" ngpus="5" coll="broadcast"', text) and 'root="2"' in text
    back = msccl.read(text, count=7)  # any count: one chunk of 7 elements
    assert back.root == 2 and verify(back)
