"""Reading MSCCL-IR: hand-written files (one per step type, in place and out of place, with scratch; 8-GPU LL
programs in the shape published files have), broken programs reported by the verifier at their GPU, threadblock and
step, and malformed files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collectives import ScheduleError, emulate, msccl, topology, verify
from collectives.msccl import MscclFormatError
from collectives.simulate import simulate

DATA = Path(__file__).parent / "data" / "msccl"


def reference(collective: str, inputs: list[np.ndarray], root: int | None) -> list[np.ndarray | None]:
    p = len(inputs)
    if collective == "allreduce":
        return [sum(inputs)] * p
    if collective == "allgather":
        return [np.concatenate(inputs)] * p
    if collective == "reduce_scatter":
        k = inputs[0].size // p
        return [sum(inputs)[r * k:(r + 1) * k] for r in range(p)]
    if collective == "alltoall":
        k = inputs[0].size // p
        return [np.concatenate([x[r * k:(r + 1) * k] for x in inputs]) for r in range(p)]
    if collective == "broadcast":
        return [inputs[root]] * p
    raise AssertionError(collective)


def run(path: Path, inplace: bool, count: int | None = None):
    s = msccl.read(path, inplace=inplace, count=count)
    verify(s)
    rng = np.random.default_rng(3)
    inputs = [rng.integers(-1000, 1000, s.input_count(r)).astype(np.int64) for r in range(s.world_size)]
    for r, (got, want) in enumerate(zip(emulate(s, inputs), reference(s.collective, inputs, s.root), strict=True)):
        assert got.tobytes() == want.tobytes(), f"{path.name} rank {r}"
    return s


@pytest.mark.parametrize("name, modes, collective", [
    ("ring-allreduce.xml", (True, False), "allreduce"),
    ("allpairs-allreduce-scratch.xml", (True,), "allreduce"),
    ("alltoall-outofplace.xml", (False,), "alltoall"),
    ("ring-allgather-inplace.xml", (True,), "allgather"),
    ("reducescatter-rrc.xml", (True, False), "reduce_scatter"),
    ("chain-broadcast.xml", (True, False), "broadcast"),
    ("allpairs-allreduce-8gpu-ll.xml", (True,), "allreduce"),
    ("alltoall-8gpu-ll.xml", (False,), "alltoall"),
])
def test_files_verify_and_emulate_in_every_declared_mode(name, modes, collective):
    algo = msccl.parse(DATA / name)
    assert algo.coll == collective
    assert (algo.inplace, algo.outofplace) == (True in modes, False in modes)
    for inplace in modes:
        s = run(DATA / name, inplace)
        assert s.params["layout"] == ("in-place" if inplace else "out-of-place")
        # a larger count the executor runs: several elements per chunk
        run(DATA / name, inplace, count=3 * s.count)


def test_default_mode_and_count():
    s = msccl.read(DATA / "ring-allreduce.xml")
    assert s.params["layout"] == "out-of-place" and s.count == 3 and s.algorithm == "msccl:ring allreduce 3 gpus"
    assert s.regions.input == 0 and s.regions.output == 3
    assert msccl.read(DATA / "ring-allgather-inplace.xml").count == 1  # nchunksperloop 3 over 3 GPUs
    with pytest.raises(ValueError, match="is for in-place calls only"):
        msccl.read(DATA / "ring-allgather-inplace.xml", inplace=False)
    with pytest.raises(ValueError, match="is for out-of-place calls only"):
        msccl.read(DATA / "alltoall-outofplace.xml", inplace=True)


def test_rounds_follow_the_dependency_structure():
    # the ring: s, rrs, rrcs, rcs, r forwards through p - 1 = 2 reduce hops and 2 allgather hops
    assert msccl.read(DATA / "ring-allreduce.xml").num_rounds == 4
    # all pairs: exchange into scratch, fold locally (the two re fuse into one round), then broadcast
    s = msccl.read(DATA / "allpairs-allreduce-scratch.xml")
    assert s.num_rounds == 3
    local = [o for o in s.program(0) if o.peer == 0 and o.kind == 2]
    assert len(local) == 2 and local[0].round == local[1].round == 1  # one fused reduction
    # the chain pipelines its two chunks: GPU 2 receives them in rounds 1 and 2
    chain = msccl.read(DATA / "chain-broadcast.xml")
    assert chain.root == 0 and [o.round for o in chain.program(2)] == [1, 2]


def test_all_pairs_on_two_channels_folds_in_one_round_and_simulates_in_its_protocol():
    # exchange into scratch, the seven re per channel fused into one reduction, then the reduced chunks back
    s = msccl.read(DATA / "allpairs-allreduce-8gpu-ll.xml")
    assert s.num_rounds == 3 and verify(s).local_steps == 8 * 2 * 7
    topo = topology.preset("dgx-h100", nodes=1)
    assert simulate(s, topo).protocol == "LL"  # the file's proto, not the fastest of NCCL's
    assert simulate(s, topo, protocol="Simple").protocol == "Simple"


def test_count_the_executor_would_not_run():
    with pytest.raises(ValueError, match=r"runs this allreduce only when count x 1 is a multiple of "
                                         r"nchunksperloop=3 .*valid counts are multiples of 3, e.g. 3 or 6"):
        msccl.read(DATA / "ring-allreduce.xml", count=4)
    with pytest.raises(ValueError, match="count must be an integer > 0"):
        msccl.read(DATA / "ring-allreduce.xml", count=0)


@pytest.mark.parametrize("name, fragments", [
    ("broken-missing-receive.xml", ["[GPU 1, threadblock 2, step 0 (s)]",
                                    "send to node 2 has no matching receive on node 2"]),
    ("broken-reduced-twice.xml", ["[GPU 1, threadblock 2, step 3 (re)]",
                                  "double contribution: ranks {0} would be counted twice"]),
    ("broken-deadlock.xml", ["deadlock under the blocking order",
                             "node 0 op 0 (round 0) [GPU 0, threadblock 0, step 0 (r)] waits for node 1's op 1 in "
                             "round 1 [GPU 1, threadblock 0, step 1 (s)]",
                             "[GPU 0, threadblock 0, step 1 (s)]"]),
])
def test_broken_programs_name_gpu_threadblock_and_step(name, fragments):
    s = msccl.read(DATA / name)
    with pytest.raises(ScheduleError) as info:
        verify(s)
    for fragment in fragments:
        assert fragment in str(info.value)


ALGO = ('<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="1" '
        'outofplace="0" minBytes="0" maxBytes="0">{gpus}</algo>')
GPU = '<gpu id="{g}" i_chunks="1" o_chunks="2" s_chunks="0">{tbs}</gpu>'
STEP = ('<step s="{s}" type="{t}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" cnt="1" depid="{di}" '
        'deps="{ds}" hasdep="{h}"/>')


def exchange(g: int, tb_attrs: str = "", first=None, extra: str = "") -> str:
    """GPU g of a 2-GPU in-place allgather: send its block, receive the other's."""
    other = 1 - g
    s0 = first or STEP.format(s=0, t="s", sb="i", so=0, db="o", do=g, di=-1, ds=-1, h=0)
    s1 = STEP.format(s=1, t="r", sb="o", so=other, db="o", do=other, di=-1, ds=-1, h=0)
    tb = f'<tb id="0" send="{other}" recv="{other}" chan="0" {tb_attrs}>{s0}{s1}</tb>' + extra
    return GPU.format(g=g, tbs=tb)


def text(gpu0: str | None = None, gpu1: str | None = None) -> str:
    return ALGO.format(gpus=(gpu0 or exchange(0)) + (gpu1 or exchange(1)))


def test_a_minimal_text_program_verifies():
    s = msccl.read(text())
    assert verify(s).messages == 2 and s.num_rounds == 1


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace('type="r"', 'type="rx"', 1), "GPU 0, threadblock 0, step 1: type='rx'; step types are"),
    (lambda t: t.replace('coll="allgather"', 'coll="gather"'), "collective 'gather' is not one this library runs"),
    (lambda t: t.replace('proto="Simple"', 'proto="LL64"'), "proto='LL64'; the MSCCL executor accepts Simple, LL, LL128"),
    (lambda t: t.replace(' ngpus="2"', ""), "<algo> has no 'ngpus' attribute"),
    (lambda t: t.replace('srcbuf="i"', 'srcbuf="x"', 1), "srcbuf='x'; buffers are i (input), o (output), s (scratch)"),
    (lambda t: t.replace('dstoff="1" cnt="1"', 'dstoff="2" cnt="1"', 1),
     "chunks [2, 3) of buffer 'o' are outside its 2 chunks"),
    (lambda t: t.replace('send="1" recv="1"', 'send="0" recv="1"', 1),
     "GPU 0, threadblock 0: send=0; a threadblock's peer is another GPU"),
    (lambda t: t.replace('<gpu id="1"', '<gpu id="0"', 1), "GPU 0 appears twice"),
    (lambda t: t.replace('<tb id="0"', '<tb id="1"', 1), "threadblock 0 is missing"),
    (lambda t: t.replace('deps="-1" hasdep="0"/>', 'deps="-1" hasdep="0"/><op/>', 0) + "<", "not well-formed XML"),
    (lambda t: t.replace('depid="-1" deps="-1"', 'depid="0" deps="1"', 1),
     "waits for threadblock 0's step 1, but no step of that threadblock at or after 1 signals"),
    (lambda t: t.replace('depid="-1"', 'depid="4"', 1), "depid=4 names no threadblock of GPU 0"),
    (lambda t: t.replace('cnt="1"', 'cnt="x"', 1), "cnt='x' is not an integer"),
])
def test_malformed_files_are_named(mutate, message):
    with pytest.raises((MscclFormatError, ValueError)) as info:
        msccl.read(mutate(text()))
    assert message in str(info.value)


def test_a_second_threadblock_on_one_connection_is_refused():
    extra = ('<tb id="1" send="1" recv="-1" chan="0">'
             + STEP.format(s=0, t="s", sb="i", so=0, db="o", do=0, di=-1, ds=-1, h=0) + "</tb>")
    with pytest.raises(MscclFormatError, match="threadblocks 0 and 1 both send to GPU 1 on channel 0"):
        msccl.read(text(gpu0=exchange(0, extra=extra)))


def test_channel_minus_one_for_local_threadblocks_as_earlier_msccl_tools_wrote():
    local = ('<tb id="1" send="-1" recv="-1" chan="-1">'
             + STEP.format(s=0, t="cpy", sb="o", so=0, db="o", do=0, di=-1, ds=-1, h=0) + "</tb>")
    s = msccl.read(text(gpu0=exchange(0, extra=local)))
    assert any("GPU 0, threadblock 1 has chan=-1" in n for n in s.notes)
    assert verify(s).local_steps == 1
    with pytest.raises(MscclFormatError, match="chan=-1 must be >= 0 .-1 only for a threadblock with no peers."):
        msccl.read(text().replace('chan="0"', 'chan="-1"', 1))


def test_newer_msccl_tools_format_and_missing_files_are_explained():
    with pytest.raises(MscclFormatError, match="lists <op> elements .msccl-tools' newer format."):
        msccl.read(ALGO.format(gpus=GPU.format(g=0, tbs='<tb id="0" send="1" recv="-1" chan="0"><op/></tb>')))
    with pytest.raises(FileNotFoundError, match="no MSCCL-IR file 'nope.xml'"):
        msccl.read("nope.xml")


def test_executor_limits_become_notes():
    # each GPU's block is 72 chunks, sent in one step: the executor refuses cnt >= 72, the program is still right
    step = ('<step s="{s}" type="{t}" srcbuf="{b}" srcoff="{o}" dstbuf="o" dstoff="{o}" cnt="72" depid="-1" '
            'deps="-1" hasdep="0"/>')
    gpus = "".join(f'<gpu id="{g}" i_chunks="72" o_chunks="144" s_chunks="0"><tb id="0" send="{1 - g}" '
                   f'recv="{1 - g}" chan="0">{step.format(s=0, t="s", b="i", o=0)}'
                   f'{step.format(s=1, t="r", b="o", o=72 * (1 - g))}</tb></gpu>' for g in (0, 1))
    s = msccl.read(ALGO.replace('nchunksperloop="2"', 'nchunksperloop="144"').format(gpus=gpus))
    assert any("GPU 0, threadblock 0, step 0: cnt=72; the MSCCL executor refuses cnt >= 72" in n for n in s.notes)
    assert verify(s).messages == 2
