"""MSCCL-IR XML as data: parse a file into `Algorithm` / `Gpu` / `Threadblock` / `Step`, checking what the MSCCL
executor checks, and the executor's limits (for the writer).

The format follows the MSCCL executor's parser (Azure/msccl-executor-nccl, src/misc/msccl/msccl_parser.cc,
mscclGetAlgoFromXmlFile) and the writer in microsoft/msccl-tools (msccl/language/ir.py, ir_to_xml):

    <algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

Unknown elements and attributes are ignored, as the executor ignores them. Errors name the GPU, threadblock
and step and say what would be right.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# -- the executor's limits (msccl_struct.h, msccl_parser.h, makefiles/common.mk) ------------------------------
MAX_COUNT = 72  # MSCCL_MAX_COUNT: a step moves cnt < 72 chunks
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL
MAX_STEPS = 256  # steps per threadblock we write by default (MSCCL_MAX_NUM_STEPS is a build option; default 64)
MAX_XML_NODES = 4096  # MAX_NODES of the parser: algo + gpus + one GPU's tbs and steps
MAX_SUBS = 1024  # MAX_SUBS: children of one element
MAX_OFFSET = 32767  # srcOffset/dstOffset are int16_t in mscclTransmission
PROTOCOLS = ("Simple", "LL", "LL128")
STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SENDS = ("s", "rcs", "rrs", "rrcs")  # step types that send to the threadblock's send peer
RECEIVES = ("r", "rcs", "rrs", "rrc", "rrcs")  # ... that receive from its recv peer
BUFFERS = ("i", "o", "s")
# the executor's collective names (mscclGetAlgoFromXmlFile) -> ours; reduce_scatter is also spelled so in files
COLLECTIVE_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
                    "reduce_scatter": "reduce_scatter", "alltoall": "alltoall", "broadcast": "broadcast",
                    "reduce": "reduce"}
FILE_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reduce_scatter": "reducescatter",
              "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce"}


class MscclFormatError(ValueError):
    """An MSCCL-IR file the executor would reject or that does not describe a program (where, and what is right)."""


@dataclass
class Step:
    index: int  # position in its threadblock (what depid/deps count)
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: bool


@dataclass
class Threadblock:
    id: int
    send: int
    recv: int
    chan: int
    steps: list[Step] = field(default_factory=list)


@dataclass
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[Threadblock] = field(default_factory=list)  # by id: tbs[t].id == t


@dataclass
class Algorithm:
    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str  # our collective name
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    root: int | None  # our own attribute for broadcast/reduce files (the executor has no root)
    gpus: list[Gpu]
    source: str = ""  # file name, for messages
    notes: list[str] = field(default_factory=list)  # what the executor would refuse or warn about


def where(gpu: int, tb: int | None = None, step: int | None = None) -> str:
    text = f"GPU {gpu}"
    if tb is not None:
        text += f", threadblock {tb}"
    if step is not None:
        text += f", step {step}"
    return text


def _int(el: ET.Element, attr: str, context: str, default: int | None = None) -> int:
    text = el.get(attr)
    if text is None:
        if default is not None:
            return default
        raise MscclFormatError(f"{context}: <{el.tag}> has no {attr!r} attribute (the MSCCL executor requires it)")
    try:
        return int(text.strip())
    except ValueError:
        raise MscclFormatError(f"{context}: {attr}={text!r} is not an integer") from None


def _text_or_path(path_or_text) -> tuple[str, str]:
    """(xml text, source name) of a path or of XML text."""
    if isinstance(path_or_text, os.PathLike):
        path_or_text = os.fspath(path_or_text)
    if not isinstance(path_or_text, str):
        raise TypeError(f"read takes a path or XML text, got {type(path_or_text).__name__}")
    if path_or_text.lstrip().startswith("<"):
        return path_or_text, "<text>"
    try:
        with open(path_or_text, encoding="utf-8") as fh:
            return fh.read(), os.path.basename(path_or_text)
    except FileNotFoundError:
        raise FileNotFoundError(f"no MSCCL-IR file {path_or_text!r} (read takes a path or the XML text itself)") from None


def parse(path_or_text) -> Algorithm:
    """Parse and check an MSCCL-IR file (a path or the XML text)."""
    text, source = _text_or_path(path_or_text)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise MscclFormatError(f"{source}: not well-formed XML ({exc})") from None
    algo = root if root.tag == "algo" else root.find(".//algo")
    if algo is None:
        raise MscclFormatError(f"{source}: no <algo> element (an MSCCL-IR file is <algo ...><gpu ...><tb ...><step .../>)")
    ctx = f"{source}: <algo>"
    coll_text = algo.get("coll")
    if coll_text is None:
        raise MscclFormatError(f"{ctx} has no 'coll' attribute (the MSCCL executor requires it)")
    if coll_text not in COLLECTIVE_NAMES:
        raise MscclFormatError(f"{ctx}: collective {coll_text!r} is not one this library runs; supported: "
                               f"{', '.join(sorted(COLLECTIVE_NAMES))}")
    notes: list[str] = []
    proto = algo.get("proto", "")
    if proto not in PROTOCOLS:
        raise MscclFormatError(f"{ctx}: proto={proto!r}; the MSCCL executor accepts {', '.join(PROTOCOLS)}")
    ngpus = _int(algo, "ngpus", ctx)
    nchunks = _int(algo, "nchunksperloop", ctx)
    nchannels = _int(algo, "nchannels", ctx)
    if ngpus < 1 or nchunks < 1 or nchannels < 1:
        raise MscclFormatError(f"{ctx}: ngpus, nchunksperloop and nchannels must be >= 1, got {ngpus}, {nchunks}, "
                               f"{nchannels}")
    inplace = bool(_int(algo, "inplace", ctx, default=0))
    if algo.get("outofplace") is None:
        notes.append("the file has no 'outofplace' attribute (the MSCCL executor requires one); read as "
                     f"{'in-place only' if inplace else 'out-of-place'}")
    outofplace = bool(_int(algo, "outofplace", ctx, default=0 if inplace else 1))
    for attr in ("minBytes", "maxBytes"):
        if algo.get(attr) is None:
            notes.append(f"the file has no {attr!r} attribute (the MSCCL executor requires one)")
    if not (inplace or outofplace):
        raise MscclFormatError(f"{ctx}: inplace=0 and outofplace=0: the executor would never run it")
    root_attr = algo.get("root")
    result = Algorithm(name=algo.get("name", ""), proto=proto, nchannels=nchannels, nchunksperloop=nchunks,
                       ngpus=ngpus, coll=COLLECTIVE_NAMES[coll_text], inplace=inplace, outofplace=outofplace,
                       min_bytes=_int(algo, "minBytes", ctx, default=0), max_bytes=_int(algo, "maxBytes", ctx, default=0),
                       root=None if root_attr is None else _int(algo, "root", ctx), gpus=[], source=source,
                       notes=notes)
    gpus: dict[int, Gpu] = {}
    for g_el in algo.findall("gpu"):
        gid = _int(g_el, "id", f"{source}: <gpu>")
        if not 0 <= gid < ngpus:
            raise MscclFormatError(f"{source}: <gpu id={gid}> is outside 0..{ngpus - 1} (ngpus={ngpus})")
        if gid in gpus:
            raise MscclFormatError(f"{source}: GPU {gid} appears twice")
        gctx = f"{source}: {where(gid)}"
        gpu = Gpu(gid, _int(g_el, "i_chunks", gctx), _int(g_el, "o_chunks", gctx), _int(g_el, "s_chunks", gctx))
        if min(gpu.i_chunks, gpu.o_chunks, gpu.s_chunks) < 0:
            raise MscclFormatError(f"{gctx}: i_chunks, o_chunks and s_chunks must be >= 0")
        gpu.tbs = _threadblocks(g_el, gpu, result, source)
        gpus[gid] = gpu
    missing = sorted(set(range(ngpus)) - set(gpus))
    if missing:
        raise MscclFormatError(f"{source}: ngpus={ngpus} but there is no <gpu> for id(s) {missing[:8]}")
    result.gpus = [gpus[g] for g in range(ngpus)]
    return result


def _threadblocks(g_el: ET.Element, gpu: Gpu, algo: Algorithm, source: str) -> list[Threadblock]:
    tbs: dict[int, Threadblock] = {}
    gctx = f"{source}: {where(gpu.id)}"
    for t_el in g_el.findall("tb"):
        tid = _int(t_el, "id", f"{gctx}, <tb>")
        tctx = f"{source}: {where(gpu.id, tid)}"
        if tid < 0 or tid in tbs:
            raise MscclFormatError(f"{tctx}: threadblock ids must be distinct and >= 0")
        tb = Threadblock(tid, _int(t_el, "send", tctx), _int(t_el, "recv", tctx), _int(t_el, "chan", tctx))
        for peer, what in ((tb.send, "send"), (tb.recv, "recv")):
            if peer == gpu.id or not -1 <= peer < algo.ngpus:
                raise MscclFormatError(f"{tctx}: {what}={peer}; a threadblock's peer is another GPU (0..{algo.ngpus - 1}, "
                                       f"not {gpu.id}) or -1")
        if tb.chan < 0:
            if tb.chan != -1 or tb.send >= 0 or tb.recv >= 0:
                raise MscclFormatError(f"{tctx}: chan={tb.chan} must be >= 0 (-1 only for a threadblock with no peers)")
            # earlier msccl-tools wrote chan=-1 for threadblocks with local steps only (msccl_struct.h still says
            # so); the executor's parser now refuses it
            algo.notes.append(f"{where(gpu.id, tid)} has chan=-1 (local steps only, as earlier msccl-tools wrote "
                              "it); the MSCCL executor now refuses negative channels")
        if tb.chan >= algo.nchannels:
            algo.notes.append(f"{where(gpu.id, tid)} uses channel {tb.chan} but nchannels={algo.nchannels}")
        if t_el.find("op") is not None and t_el.find("step") is None:
            raise MscclFormatError(f"{tctx} lists <op> elements (msccl-tools' newer format); the MSCCL executor "
                                   "reads <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/> (write "
                                   "with old_format=True)")
        for j, s_el in enumerate(t_el.findall("step")):
            tb.steps.append(_step(s_el, j, gpu, tb, algo, source))
        tbs[tid] = tb
    ids = sorted(tbs)
    if ids != list(range(len(ids))):
        gap = next(i for i in range(len(ids) + 1) if i not in tbs)
        raise MscclFormatError(f"{gctx}: threadblock {gap} is missing (ids must be 0..n-1, as the executor requires)")
    ordered = [tbs[i] for i in ids]
    _check_connections(gpu.id, ordered, source)
    return ordered


def _step(s_el: ET.Element, index: int, gpu: Gpu, tb: Threadblock, algo: Algorithm, source: str) -> Step:
    sctx = f"{source}: {where(gpu.id, tb.id, index)}"
    kind = s_el.get("type")
    if kind not in STEP_TYPES:
        raise MscclFormatError(f"{sctx}: type={kind!r}; step types are {', '.join(STEP_TYPES)}")
    step = Step(index, kind, s_el.get("srcbuf", "i"), _int(s_el, "srcoff", sctx, default=-1), s_el.get("dstbuf", "o"),
                _int(s_el, "dstoff", sctx, default=-1), _int(s_el, "cnt", sctx, default=0),
                _int(s_el, "depid", sctx, default=-1), _int(s_el, "deps", sctx, default=-1),
                bool(_int(s_el, "hasdep", sctx, default=0)))
    if kind == "nop":
        return step
    for attr in ("s", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"):
        if s_el.get(attr) is None:
            raise MscclFormatError(f"{sctx}: <step> has no {attr!r} attribute (the MSCCL executor requires it)")
    if step.cnt < 0:
        raise MscclFormatError(f"{sctx}: cnt={step.cnt} must be >= 0")
    if step.cnt >= MAX_COUNT:
        algo.notes.append(f"{where(gpu.id, tb.id, index)}: cnt={step.cnt}; the MSCCL executor refuses cnt >= "
                          f"{MAX_COUNT} (MSCCL_MAX_COUNT)")
    for buf, what in ((step.srcbuf, "srcbuf"), (step.dstbuf, "dstbuf")):
        if buf not in BUFFERS:
            raise MscclFormatError(f"{sctx}: {what}={buf!r}; buffers are i (input), o (output), s (scratch)")
    if kind in SENDS and tb.send < 0:
        raise MscclFormatError(f"{sctx}: a {kind!r} step sends, but its threadblock has no send peer (send=-1)")
    if kind in RECEIVES and tb.recv < 0:
        raise MscclFormatError(f"{sctx}: a {kind!r} step receives, but its threadblock has no recv peer (recv=-1)")
    return step


def _check_connections(gpu: int, tbs: list[Threadblock], source: str) -> None:
    """One threadblock per (peer, channel) and direction: a connection carries one threadblock's messages in order."""
    seen: dict[tuple[str, int, int], int] = {}
    for tb in tbs:
        for direction, peer in (("send", tb.send), ("recv", tb.recv)):
            if peer < 0:
                continue
            key = (direction, peer, tb.chan)
            if key in seen:
                raise MscclFormatError(
                    f"{source}: {where(gpu)}: threadblocks {seen[key]} and {tb.id} both {direction} "
                    f"{'to' if direction == 'send' else 'from'} GPU {peer} on channel {tb.chan}; a connection (peer, "
                    "channel) belongs to one threadblock, so its messages have one order")
            seen[key] = tb.id
