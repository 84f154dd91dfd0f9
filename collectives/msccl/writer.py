"""Write a schedule as MSCCL-IR XML that the MSCCL executor accepts (see steps.py for buffers and chunks).

Threadblocks. Every message's directed connection (a -> b) is placed on a channel (the messages of one
connection round-robin over the channels, from a first channel that spreads a GPU's peers over them), and each
GPU gets one threadblock per (send peer, receive peer, channel): its sends to one peer paired with its receives
from another, as msccl-tools pairs them, plus one threadblock for local copies and reductions. A threadblock
runs its steps in stage order, sends before receives within a stage: the IR's round semantics on one stream.

Dependencies (depid/deps; extra ones as nop steps before the step, as msccl-tools' ir.py writes them):

* data: a step waits for the last step of every other threadblock that wrote what it reads or writes, or read
  what it writes (a write waits for the sends of its own round that read the range);
* rounds: the first step of a threadblock in a stage waits for the node's previous stage, every threadblock of
  it (its own threadblock's previous step too, where program order alone would let the two share a round),
  and a node idle in a stage gets a zero-count local copy there: so every node's stage k is round k when the
  file is read back, and the program keeps the IR's per-node round order (the MPI transport's "post a round,
  wait for it"), which is what makes pairwise exchange pairwise rather than all at once.

Limits: 32 threadblocks per channel, `max_steps` steps per threadblock, 4096 XML elements per GPU, offsets that
fit the executor's int16; the writer refuses with a clear error rather than write a file the executor rejects.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import numpy as np

from ..schedule import Schedule
from ..schedule.expand import expand, pair_messages
from .fileformat import FILE_NAMES, MAX_STEPS, MAX_SUBS, MAX_TBS_PER_CHANNEL, MAX_XML_NODES, PROTOCOLS
from .steps import Buffers, MStep, build_steps, multiplier


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    steps: list = field(default_factory=list)  # MStep, or ("nop", target) for an extra dependency


def write(schedule: Schedule, *, proto: str = "Simple", channels: int = 1, inplace: bool | None = None,
          min_bytes: int = 0, max_bytes: int = 0, max_steps: int = MAX_STEPS, name: str | None = None) -> str:
    """`schedule` as MSCCL-IR XML: every attribute the executor reads, one threadblock per (send peer, receive
    peer, channel), `minBytes`/`maxBytes` as given (0: no limit).

    `inplace`: None writes a schedule on the contract's logical vector in place and one with input and output
    regions as its regions say; False writes the former out of place (copies in and out of scratch).
    `max_steps`: steps per threadblock the target executor was built for (MSCCL_MAX_NUM_STEPS).
    """
    s = schedule
    if not isinstance(s, Schedule):
        raise TypeError(f"write takes a built Schedule, got {type(s).__name__}")
    if proto not in PROTOCOLS:
        raise ValueError(f"proto must be one of {', '.join(PROTOCOLS)} (the MSCCL executor's protocols), got {proto!r}")
    for value, what in ((channels, "channels"), (max_steps, "max_steps")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    for value, what in ((min_bytes, "min_bytes"), (max_bytes, "max_bytes")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{what} must be an integer >= 0 (0: no limit), got {value!r}")
    if max_bytes and max_bytes < min_bytes:
        raise ValueError(f"need min_bytes <= max_bytes (0: no limit), got {min_bytes} > {max_bytes}")
    if s.collective not in FILE_NAMES:
        raise ValueError(f"MSCCL-IR cannot express {s.collective}: its chunks are equal in size, while an "
                         f"{s.collective}'s blocks differ per rank; write the uniform collective (alltoall) instead")
    switches = sorted({int(n) for ph in s.phases for n in np.unique(ph.groups) if n >= s.world_size})
    if switches:
        raise ValueError(f"{s.algorithm}'s schedule runs on switch nodes ({s.label(switches[0])}, ...): MSCCL-IR "
                         "programs have GPUs only, so in-network reduction (NVLS, SHARP) cannot be written; choose "
                         "a host algorithm (for hierarchical: intra=ring and a host inter algorithm)")
    if s.count == 0:
        raise ValueError("count must be > 0: MSCCL-IR chunks divide the call's elements")
    t = expand(s)
    pairs = pair_messages(t)
    if pairs is None:
        raise ValueError(f"{s.algorithm}: its sends and receives do not pair up in rounds; "
                         "collectives.verify(schedule) names the unmatched one")
    bufs = Buffers(s, inplace)
    steps, unit, scratch = build_steps(s, t, pairs, bufs)
    _clock(steps, s.world_size)
    _place(steps, s.world_size, channels)
    gpus = _threadblocks(steps, s.world_size)
    _dependencies(steps)
    _round_order(gpus)
    nchunks = s.count * multiplier(s.collective, s.world_size) // unit
    return _xml(s, gpus, bufs, unit, nchunks, scratch, proto, channels, min_bytes, max_bytes, max_steps, name)


def _place(steps: list[MStep], p: int, channels: int) -> None:
    """Channel of every message: the k-th message of connection a -> b goes to (home + k) % channels, where
    home = ((b - a) mod p) mod channels spreads a GPU's peers over the channels."""
    seen: dict[tuple[int, int], int] = {}
    for x in sorted((x for x in steps if x.type == "s"), key=lambda x: (x.stage, x.node, x.order)):
        k = seen.get((x.node, x.peer_send), 0)
        seen[(x.node, x.peer_send)] = k + 1
        x.channel = ((x.peer_send - x.node) % p % channels + k) % channels
    for x in steps:
        if x.pair is not None:
            x.channel = x.pair.channel


def _threadblocks(steps: list[MStep], p: int) -> list[list[_Tb]]:
    """Per GPU: one threadblock per (send peer, receive peer, channel), pairing a channel's connections in the
    order they first carry a message, and one for local steps; each in execution order."""
    gpus: list[list[_Tb]] = []
    for node in range(p):
        mine = [x for x in steps if x.node == node]
        first: dict[tuple[int, int, int], tuple] = {}  # (direction, peer, channel) -> first stage
        for x in mine:
            if x.type in ("cpy", "re"):
                continue
            key = (0, x.peer_send, x.channel) if x.type == "s" else (1, x.peer_recv, x.channel)
            first[key] = min(first.get(key, x.stage), x.stage)
        tbs: list[_Tb] = []
        home: dict[tuple[int, int, int], _Tb] = {}
        for c in sorted({k[2] for k in first}):
            sends = sorted((st, k[1]) for k, st in first.items() if k[0] == 0 and k[2] == c)
            recvs = sorted((st, k[1]) for k, st in first.items() if k[0] == 1 and k[2] == c)
            for i in range(max(len(sends), len(recvs))):
                tb = _Tb(sends[i][1] if i < len(sends) else -1, recvs[i][1] if i < len(recvs) else -1, c)
                tbs.append(tb)
                if tb.send >= 0:
                    home[(0, tb.send, c)] = tb
                if tb.recv >= 0:
                    home[(1, tb.recv, c)] = tb
        local = _Tb(-1, -1, 0)
        for x in mine:
            if x.type in ("cpy", "re"):
                local.steps.append(x)
            else:
                home[(0, x.peer_send, x.channel) if x.type == "s" else (1, x.peer_recv, x.channel)].steps.append(x)
        if local.steps:
            tbs.append(local)
        for tb_id, tb in enumerate(tbs):
            tb.steps.sort(key=MStep.key)
            for pos, x in enumerate(tb.steps):
                x.tb, x.pos = tb_id, pos
        gpus.append(tbs)
    return gpus


def _chunks(r: tuple[str, int, int] | None):
    return () if r is None else ((r[0], c) for c in range(r[1], r[1] + r[2]))


def _dependencies(steps: list[MStep]) -> None:
    """Per GPU, in stage order (a stage's sends before its writes, then program order): a step depends on the
    last step of every other threadblock that wrote what it reads or writes, or read what it writes."""
    by_node: dict[int, list[MStep]] = {}
    for x in steps:
        by_node.setdefault(x.node, []).append(x)
    for node, mine in by_node.items():
        mine.sort(key=MStep.key)
        writer: dict[tuple[str, int], MStep] = {}
        readers: dict[tuple[str, int], list[MStep]] = {}
        for y in mine:
            waits: list[MStep] = []
            for c in _chunks(y.reads):
                w = writer.get(c)
                if w is not None:
                    if w.stage == y.stage:
                        raise ValueError(f"node {node}, round {y.stage[0]}: a local step reads chunks that another "
                                         "step of the same round writes; MSCCL runs steps one after the other, so "
                                         "the schedule needs that write in a later round")
                    waits.append(w)
            for c in _chunks(y.writes):
                if c in writer:
                    waits.append(writer[c])
                waits += readers.get(c, ())
            y.deps = _latest_per_tb(waits, y.tb)
            for c in _chunks(y.writes):
                writer[c] = y
                readers[c] = []
            for c in _chunks(y.reads):
                readers.setdefault(c, []).append(y)


def _latest_per_tb(steps, tb: int) -> list[MStep]:
    found: dict[int, MStep] = {}
    for x in steps:
        if x.tb != tb and (x.tb not in found or found[x.tb].pos < x.pos):
            found[x.tb] = x
    return [found[k] for k in sorted(found)]


def _clock(steps: list[MStep], p: int) -> None:
    """Give every node a step in every stage: a zero-count local copy where it is idle (no data, no cost), so
    that with `_round_order` each node's stage k is the read-back's round k and no message's two ends drift
    apart (the IR's rounds are rendezvous: a node enters round k after its round k - 1, idle or not)."""
    stages = sorted({x.stage for x in steps})
    busy = {(x.node, x.stage) for x in steps}
    for node in range(p):
        for st in stages:
            if (node, st) not in busy:
                steps.append(MStep(node, st, 1, (-2,), "cpy", src=("o", 0), dst=("o", 0), cnt=0))


def _round_order(gpus: list[list[_Tb]]) -> None:
    """The first step of each threadblock in a stage also waits for every threadblock's last step of the
    previous stage; for its own threadblock only where program order would let it share that stage's round
    (after a send, or a write after a write)."""
    for tbs in gpus:
        stages = sorted({x.stage for tb in tbs for x in tb.steps})
        previous = {b: a for a, b in zip(stages[:-1], stages[1:], strict=True)}
        last: dict[tuple, list[MStep]] = {}
        for tb in tbs:
            for i, x in enumerate(tb.steps):
                if i + 1 == len(tb.steps) or tb.steps[i + 1].stage != x.stage:
                    last.setdefault(x.stage, []).append(x)
        for tb in tbs:
            for i, x in enumerate(tb.steps):
                if x.stage not in previous or (i and tb.steps[i - 1].stage == x.stage):
                    continue
                before = last.get(previous[x.stage], [])
                x.deps = _latest_per_tb(x.deps + before, x.tb)
                own = tb.steps[i - 1] if i else None
                if own is not None and own.stage == previous[x.stage] and (own.type == "s" or x.type != "s"):
                    x.deps.append(own)  # a dependency on its own threadblock's previous step


def _xml(s: Schedule, gpus: list[list[_Tb]], bufs: Buffers, unit: int, nchunks: int, scratch: int, proto: str,
         channels: int, min_bytes: int, max_bytes: int, max_steps: int, name: str | None) -> str:
    p = s.world_size
    # drop dependencies an earlier step of the threadblock already waited for; extra ones become nop steps
    for tbs in gpus:
        for tb in tbs:
            covered: dict[int, int] = {}
            out: list = []
            for x in tb.steps:
                x.deps = [d for d in x.deps if covered.get(d.tb, -1) < d.pos and (d.tb != x.tb or d.pos < x.pos)]
                for d in x.deps:
                    covered[d.tb] = d.pos
                out += [("nop", d) for d in x.deps[1:]]
                out.append(x)
            tb.steps = out
    for tbs in gpus:
        for tb in tbs:
            for i, x in enumerate(tb.steps):
                if isinstance(x, MStep):
                    x.index = i
                    if x.deps:
                        x.deps[0].hasdep = True
                else:
                    x[1].hasdep = True
    _check_limits(gpus, p, max_steps)
    used = 1 + max((tb.chan for tbs in gpus for tb in tbs), default=0)
    text_name = name or f"{s.algorithm} {s.collective} p={p}" + "".join(
        f" {k}={v}" for k, v in sorted(s.params.items()) if isinstance(v, (int, str)) and not isinstance(v, bool))
    attrs = {"name": text_name.replace('"', "'"), "proto": proto, "nchannels": max(used, channels),
             "nchunksperloop": nchunks, "ngpus": p, "coll": FILE_NAMES[s.collective],
             "inplace": int(bufs.inplace), "outofplace": int(not bufs.inplace), "minBytes": min_bytes,
             "maxBytes": max_bytes}
    if s.root is not None:
        attrs["root"] = s.root  # the executor has no root and ignores this; read() uses it
    algo = ET.Element("algo", {k: str(v) for k, v in attrs.items()})
    chunks = {"i": bufs.in_size // unit, "o": bufs.out_size // unit, "s": scratch}
    for node, tbs in enumerate(gpus):
        g = ET.SubElement(algo, "gpu", {"id": str(node), "i_chunks": str(chunks["i"]), "o_chunks": str(chunks["o"]),
                                        "s_chunks": str(chunks["s"])})
        for tb_id, tb in enumerate(tbs):
            el = ET.SubElement(g, "tb", {"id": str(tb_id), "send": str(tb.send), "recv": str(tb.recv),
                                         "chan": str(tb.chan)})
            for i, x in enumerate(tb.steps):
                if isinstance(x, tuple):
                    d = x[1]
                    ET.SubElement(el, "step", {"s": str(i), "type": "nop", "srcbuf": "i", "srcoff": "-1",
                                               "dstbuf": "o", "dstoff": "-1", "cnt": "0", "depid": str(d.tb),
                                               "deps": str(d.index), "hasdep": "0"})
                    continue
                dep = x.deps[0] if x.deps else None
                ET.SubElement(el, "step", {
                    "s": str(i), "type": x.type, "srcbuf": x.src[0], "srcoff": str(x.src[1]), "dstbuf": x.dst[0],
                    "dstoff": str(x.dst[1]), "cnt": str(x.cnt), "depid": str(dep.tb if dep else -1),
                    "deps": str(dep.index if dep else -1), "hasdep": str(int(x.hasdep))})
    ET.indent(algo, space="  ")
    header = (f"<!-- {s.algorithm} {s.collective} over {p} GPUs, written by collectives.msccl.write; a chunk is "
              f"count x {multiplier(s.collective, p)} / {nchunks} elements -->\n")
    # "/>" as msccl-tools writes it: the executor's tokenizer would read " />" as one more, empty, attribute
    return header + ET.tostring(algo, encoding="unicode").replace(" />", "/>") + "\n"


def _check_limits(gpus: list[list[_Tb]], p: int, max_steps: int) -> None:
    limit = min(max_steps, MAX_SUBS)
    for node, tbs in enumerate(gpus):
        per_channel: dict[int, int] = {}
        for tb in tbs:
            per_channel[tb.chan] = per_channel.get(tb.chan, 0) + 1
            if len(tb.steps) > limit:
                raise ValueError(f"GPU {node}'s threadblock (send {tb.send}, recv {tb.recv}, channel {tb.chan}) needs "
                                 f"{len(tb.steps)} steps; the limit is {limit} (MSCCL_MAX_NUM_STEPS is set when the "
                                 "executor is built, 64 by default in its Makefile): spread the messages with more "
                                 "channels=, or raise max_steps= to your executor's value")
        chan, most = max(per_channel.items(), key=lambda kv: kv[1], default=(0, 0))
        if most > MAX_TBS_PER_CHANNEL:
            raise ValueError(f"GPU {node} needs {most} threadblocks on channel {chan}; the MSCCL executor allows "
                             f"{MAX_TBS_PER_CHANNEL} per channel (MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL): write with "
                             "more channels= (they spread a GPU's peers)")
        elements = 1 + p + len(tbs) + sum(len(tb.steps) for tb in tbs)
        if elements > MAX_XML_NODES or len(tbs) > MAX_SUBS:
            raise ValueError(f"GPU {node}'s part of the file has {elements} XML elements; the executor's parser reads "
                             f"at most {MAX_XML_NODES} (MAX_NODES in msccl_parser.h): write fewer ranks or chunks")
