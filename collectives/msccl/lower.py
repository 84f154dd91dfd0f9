"""Lower an MSCCL-IR program (per-GPU threadblocks of steps) to the schedule IR's rounds.

Steps become IR operations (a send, a receive-store, a receive-reduce, or a message to the GPU itself):

| step | operations (W: in the step's round; S: a later round)                                                |
|------|-------------------------------------------------------------------------------------------------------|
| s    | S: send src                                                                                           |
| r    | W: receive into dst                                                                                   |
| rcs  | W: receive into dst; S: send dst                                                                      |
| rrc  | W: (copy src to dst, if they differ) then receive-reduce into dst                                     |
| rrcs | as rrc; S: send dst                                                                                   |
| rrs  | W: copy src to a forwarding slot, receive-reduce into it; S: send it (the value is never stored in the |
|      | program's buffers: the slot is scratch beyond the file's own)                                         |
| cpy  | W: local copy src to dst                                                                              |
| re   | W: local reduce src into dst (consecutive re into one dst land in one round: one fused reduction)     |
| nop  | its dependency carries over to the next step of its threadblock                                       |

Rounds come from the dependency structure. Sends and receives match in FIFO order per connection (the sender
GPU's threadblock with send=b on channel c, the receiver's with recv=a on channel c); both ends of a message
share a round. Each step's first part starts no earlier than the previous step of its threadblock and than the
steps it depends on (depid/deps, resolved as the executor's flags resolve them: the first signalling step at or
after deps, msccl_kernel.cu), and a round later when:

* in a threadblock, the previous step wrote (received, copied, reduced) and this one sends (a threadblock
  blocks on its receive; so a receive-then-send cycle between GPUs is a deadlock), or reads or overwrites what
  was written, except consecutive local reductions into one destination (the executor fuses them);
* by an explicit dependency, always ("must finish first"), except a pure write-after-read: a write over what
  the other step only read may share its round, since a round's reads see its start.

A send may share its round with what follows it in its threadblock (it is posted and the threadblock moves on).
Each round variable takes the least round these constraints allow (longest paths over the strongly connected
components); a component with a round-advancing edge inside is a deadlock: its messages keep their ends' own
rounds, and the verifier names the cycle. Every operation remembers its GPU, threadblock and step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..schedule import ChunkTable, ExplicitOp, OpKind, Regions, Schedule, explicit_phase
from .fileformat import RECEIVES, SENDS, Algorithm, MscclFormatError, Step, Threadblock, where

SEND, STORE, REDUCE = OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE
MULTIPLIED = ("allgather", "reduce_scatter", "alltoall")  # the executor's sizeMultiplier = ngpus


@dataclass
class _Part:
    """One end of one IR message."""

    node: int
    kind: OpKind
    peer: int
    chunk: int
    n: int
    var: int
    origin: str
    seq: int  # creation order: ties keep the file's order
    remote: int = -1
    partner: _Part | None = None


@dataclass
class _StepParts:
    first: int  # round variable of the step's first part
    last: int
    sends_first: bool  # the step's first part is a send (an "s" step)
    type: str = ""
    reads: list[tuple[int, int]] = field(default_factory=list)  # (chunk, n) read by its local copy or reduction
    writes: list[tuple[int, int, OpKind]] = field(default_factory=list)  # (chunk, n, first write kind)
    send: _Part | None = None
    recv: _Part | None = None

    @property
    def ends_with_send(self) -> bool:
        return self.send is not None and self.last == self.send.var

    def read_ranges(self) -> list[tuple[int, int]]:
        return self.reads + ([(self.send.chunk, self.send.n)] if self.send is not None else [])


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1] and a[1] > 0 and b[1] > 0


def geometry(algo: Algorithm, count: int | None) -> tuple[int, int, int, int]:
    """(count, elements per chunk, input chunks, output chunks) for `count` (None: the smallest the executor runs)."""
    p, L, coll = algo.ngpus, algo.nchunksperloop, algo.coll
    if coll in ("allgather", "reduce_scatter", "alltoall") and L % p:
        raise MscclFormatError(f"{algo.source}: {coll} with nchunksperloop={L} over ngpus={p}: each rank's block "
                               "must be whole chunks (nchunksperloop a multiple of ngpus)")
    # total elements the executor splits into nchunksperloop chunks (count x sizeMultiplier), in our count terms
    total = (lambda c: c * p) if coll == "allgather" else (lambda c: c)
    if count is None:
        count = L // math.gcd(L, p) if coll == "allgather" else (math.lcm(L, p) if coll in MULTIPLIED else L)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count <= 0:
        raise ValueError(f"count must be an integer > 0 (elements of each rank's input), got {count!r}")
    count = int(count)
    if total(count) % L or (coll in ("reduce_scatter", "alltoall") and count % p):
        step = L // math.gcd(L, p) if coll == "allgather" else (math.lcm(L, p) if coll in MULTIPLIED else L)
        raise ValueError(f"{algo.source}: the MSCCL executor runs this {coll} only when count x "
                         f"{'ngpus' if coll in MULTIPLIED else '1'} is a multiple of nchunksperloop={L} "
                         f"(msccl_lifecycle.cc); count={count} is not; valid counts are multiples of {step}, e.g. "
                         f"{max(step, count // step * step)} or {(count // step + 1) * step}")
    e = total(count) // L
    ins = {"allgather": L // p}.get(coll, L)
    outs = {"reduce_scatter": L // p}.get(coll, L)
    return count, e, ins, outs


class _Lowering:
    def __init__(self, algo: Algorithm, count: int | None, inplace: bool, root: int) -> None:
        self.algo = algo
        self.p = algo.ngpus
        self.count, self.e, self.in_chunks, self.out_chunks = geometry(algo, count)
        self.inplace = inplace
        self.root = root
        self.scratch = max(g.s_chunks for g in algo.gpus)
        L = algo.nchunksperloop
        if inplace:  # the contract's logical vector (MSCCL's aliasing of i and o), then scratch
            self.vector = L
            self.base = {"s": L}
        else:
            self.vector = self.in_chunks + self.out_chunks
            self.base = {"i": 0, "o": self.in_chunks, "s": self.in_chunks + self.out_chunks}
        self.forward_at = self.base["s"] + self.scratch  # forwarding slots of rrs steps
        self.forward_used = [0] * self.p
        self.parts: list[_Part] = []
        self.nvars = 0
        self.edges: list[tuple[int, int, int]] = []
        self.messages: list[tuple[_Part, _Part]] = []

    # -- buffers -------------------------------------------------------------------------------------------
    def chunk(self, gpu: int, buf: str, off: int, cnt: int, ctx: str) -> int:
        """Work-buffer chunk of `buf` chunk `off` on `gpu` (MSCCL's in-place aliasing: msccl_lifecycle.cc)."""
        size = {"i": self.in_chunks, "o": self.out_chunks, "s": self.algo.gpus[gpu].s_chunks}[buf]
        if off < 0 or off + cnt > size:
            raise MscclFormatError(f"{self.algo.source}: {ctx}: chunks [{off}, {off + cnt}) of buffer {buf!r} are "
                                   f"outside its {size} chunks (a {self.algo.coll} over {self.p} GPUs with "
                                   f"nchunksperloop={self.algo.nchunksperloop}; s_chunks={self.algo.gpus[gpu].s_chunks})")
        if buf == "s" or not self.inplace:
            return self.base[buf] + off
        block = self.algo.nchunksperloop // self.p
        if self.algo.coll == "allgather" and buf == "i":
            return gpu * block + off  # sendbuff = recvbuff + rank * count
        if self.algo.coll == "reduce_scatter" and buf == "o":
            return gpu * block + off  # recvbuff = sendbuff + rank * count
        return off

    # -- parts -----------------------------------------------------------------------------------------------
    def var(self) -> int:
        self.nvars += 1
        return self.nvars - 1

    def part(self, node, kind, peer, chunk, n, var, origin) -> _Part:
        p = _Part(node, kind, peer, chunk, n, var, origin, len(self.parts))
        self.parts.append(p)
        return p

    def local(self, node: int, kind: OpKind, src: int, dst: int, n: int, var: int, origin: str) -> None:
        """A message to itself: read src, store or reduce into dst, in round `var`."""
        s = self.part(node, SEND, node, src, n, var, origin)
        r = self.part(node, kind, node, dst, n, var, origin)
        s.remote, r.remote, s.partner, r.partner = dst, src, r, s

    def lower_step(self, gpu: int, tb: Threadblock, step: Step) -> _StepParts:
        origin = f"{where(gpu, tb.id, step.index)} ({step.type})"
        ctx = where(gpu, tb.id, step.index)
        kind, n = step.type, step.cnt
        src = self.chunk(gpu, step.srcbuf, step.srcoff, n, ctx) if kind in ("s", "rrs", "rrc", "rrcs", "cpy", "re") \
            else None
        dst = self.chunk(gpu, step.dstbuf, step.dstoff, n, ctx) if kind in ("r", "rcs", "rrc", "rrcs", "cpy", "re") \
            else None
        if kind == "s":
            v = self.var()
            out = _StepParts(v, v, True, kind)
            out.send = self.part(gpu, SEND, tb.send, src, n, v, origin)
            return out
        w = self.var()
        out = _StepParts(w, w, False, kind)
        if kind in ("r", "rcs"):
            out.recv = self.part(gpu, STORE, tb.recv, dst, n, w, origin)
            out.writes.append((dst, n, STORE))
        elif kind in ("rrc", "rrcs"):
            if src != dst:
                self.local(gpu, STORE, src, dst, n, w, origin)
                out.reads.append((src, n))
            out.recv = self.part(gpu, REDUCE, tb.recv, dst, n, w, origin)
            out.writes.append((dst, n, STORE if src != dst else REDUCE))
        elif kind == "rrs":
            dst = self.forward_at + self.forward_used[gpu]
            self.forward_used[gpu] += n
            self.local(gpu, STORE, src, dst, n, w, origin)
            out.reads.append((src, n))
            out.recv = self.part(gpu, REDUCE, tb.recv, dst, n, w, origin)
            out.writes.append((dst, n, STORE))
        elif kind == "cpy":
            self.local(gpu, STORE, src, dst, n, w, origin)
            out.reads.append((src, n))
            out.writes.append((dst, n, STORE))
        elif kind == "re":
            self.local(gpu, REDUCE, src, dst, n, w, origin)
            out.reads.append((src, n))
            out.writes.append((dst, n, REDUCE))
        if kind in ("rcs", "rrcs", "rrs"):
            s = self.var()
            self.edges.append((w, s, 1))  # forwards what this step's round wrote
            out.last = s
            out.send = self.part(gpu, SEND, tb.send, dst, n, s, origin)
        return out

    @staticmethod
    def delay(x: _StepParts, y: _StepParts, explicit: bool) -> int:
        """Rounds between step x's last part and step y's first when y follows x: in program order of one
        threadblock (explicit=False) or by an explicit dependency (see the module docstring)."""
        x_writes = [(a, n) for a, n, _ in x.writes]
        if explicit:  # "must finish first": a round later, unless y only overwrites what x read (reads see a
            # round's start, so a write-after-read may share the round)
            war = any(_overlap(w[:2], r) for w in y.writes for r in x.read_ranges())
            raw_or_waw = any(_overlap(w[:2], xw) for w in y.writes for xw in x_writes) or \
                any(_overlap(r, xw) for r in y.read_ranges() for xw in x_writes)
            return 0 if war and not raw_or_waw and not y.sends_first else 1
        if x.ends_with_send or not x.writes:  # a send is posted and the threadblock moves on
            return 0
        if y.sends_first:  # the threadblock blocks on x's receive before it posts y's send
            return 1
        if any(_overlap(r, xw) for r in y.reads for xw in x_writes):  # y reads what x wrote
            return 1
        for a, n, _ in y.writes:
            for b, m in x_writes:
                if _overlap((a, n), (b, m)):
                    # the executor fuses consecutive local reductions into one destination (msccl_parser.cc)
                    fused = y.type == "re" and x.type in ("re", "cpy") and (a, n) == (b, m)
                    if not fused:
                        return 1
        return 0

    # -- the program -----------------------------------------------------------------------------------------
    def lower(self) -> None:
        steps: dict[tuple[int, int, int], _StepParts] = {}
        waits: list[tuple[_StepParts, list[tuple[int, int, int]]]] = []
        for g in self.algo.gpus:
            for tb in g.tbs:
                prev: _StepParts | None = None
                pending: list[tuple[int, int]] = []  # dependencies carried by nops to the next step
                for step in tb.steps:
                    if step.depid >= 0:
                        pending.append((step.depid, step.deps))
                    if step.type == "nop":
                        continue
                    sp = self.lower_step(g.id, tb, step)
                    steps[(g.id, tb.id, step.index)] = sp
                    if prev is not None:
                        self.edges.append((prev.last, sp.first, self.delay(prev, sp, False)))
                    waits.append((sp, [self.resolve(g.id, tb, step, d) for d in pending]))
                    pending = []
                    prev = sp
        for sp, deps in waits:
            for dep in deps:
                x = steps[dep]
                self.edges.append((x.last, sp.first, self.delay(x, sp, True)))
        self.match(steps)

    def resolve(self, gpu: int, tb: Threadblock, step: Step, dep: tuple[int, int]) -> tuple[int, int, int]:
        """(depid, deps) as the executor's flags resolve it: the first step with hasdep=1 at index >= deps of
        threadblock depid (msccl_kernel.cu, mscclRunInterpreter: wait until that threadblock's flag >= deps)."""
        depid, deps_at = dep
        tbs = self.algo.gpus[gpu].tbs
        ctx = where(gpu, tb.id, step.index)
        if not 0 <= depid < len(tbs):
            raise MscclFormatError(f"{self.algo.source}: {ctx}: depid={depid} names no threadblock of GPU {gpu}")
        target = next((s for s in tbs[depid].steps if s.index >= deps_at and s.hasdep and s.type != "nop"), None)
        if target is None:
            raise MscclFormatError(f"{self.algo.source}: {ctx}: waits for threadblock {depid}'s step {deps_at}, but "
                                   f"no step of that threadblock at or after {deps_at} signals (hasdep=1): the "
                                   "executor would wait forever")
        return gpu, depid, target.index

    def match(self, steps: dict[tuple[int, int, int], _StepParts]) -> None:
        """FIFO per connection: the k-th send of (GPU a's tb with send=b, channel c) meets the k-th receive of
        (GPU b's tb with recv=a, channel c)."""
        algo = self.algo
        sends: dict[tuple[int, int, int], list[_Part]] = {}
        recvs: dict[tuple[int, int, int], list[_Part]] = {}
        for g in algo.gpus:
            for tb in g.tbs:
                for step in tb.steps:
                    sp = steps.get((g.id, tb.id, step.index))
                    if sp is None:
                        continue
                    if step.type in SENDS:
                        sends.setdefault((g.id, tb.send, tb.chan), []).append(sp.send)
                    if step.type in RECEIVES:
                        recvs.setdefault((tb.recv, g.id, tb.chan), []).append(sp.recv)
        for key, out in sends.items():
            for s, r in zip(out, recvs.get(key, []), strict=False):
                s.remote, r.remote, s.partner, r.partner = r.chunk, s.chunk, r, s
                self.messages.append((s, r))

    # -- rounds ----------------------------------------------------------------------------------------------
    def rounds(self) -> np.ndarray:
        """Least rounds meeting every constraint; messages inside a deadlocked cycle keep separate ends."""
        dropped: set[int] = set()
        while True:
            parent = list(range(self.nvars))
            for i, (s, r) in enumerate(self.messages):
                if i not in dropped:
                    a, b = _find(parent, s.var), _find(parent, r.var)
                    if a != b:
                        parent[a] = b
            rep = [_find(parent, v) for v in range(self.nvars)]
            comp, order = _components(self.nvars, [(rep[u], rep[v]) for u, v, _ in self.edges])
            bad = {comp[rep[u]] for u, v, d in self.edges if d and comp[rep[u]] == comp[rep[v]]}
            if not bad:
                break
            more = {i for i, (s, _) in enumerate(self.messages) if i not in dropped and comp[rep[s.var]] in bad}
            if not more:
                u = next(u for u, v, d in self.edges if d and comp[rep[u]] == comp[rep[v]] and comp[rep[u]] in bad)
                steps = sorted({p.origin for p in self.parts if comp[rep[p.var]] == comp[rep[u]]})
                raise MscclFormatError(f"{self.algo.source}: a cycle of dependencies within one GPU: "
                                       f"{'; '.join(steps[:8])} each wait (directly or not) for one another")
            dropped |= more
        # longest paths over the condensation: components come in topological order
        value = np.zeros(len(order), dtype=np.int64)
        by_src: dict[int, list[tuple[int, int]]] = {}
        for u, v, d in self.edges:
            cu, cv = comp[rep[u]], comp[rep[v]]
            if cu != cv:
                by_src.setdefault(cu, []).append((cv, d))
        for c in order:
            for cv, d in by_src.get(c, ()):
                value[cv] = max(value[cv], value[c] + d)
        return np.array([value[comp[rep[v]]] for v in range(self.nvars)], dtype=np.int64)

    # -- the schedule ----------------------------------------------------------------------------------------
    def schedule(self, notes: list[str]) -> Schedule:
        rnd = self.rounds() if self.nvars else np.zeros(0, np.int64)
        # program order in a round: sends, then writes sorted by range with a store before the reductions into
        # its range (what land_receives fuses); sends to one peer follow the order of their receives there
        writes = sorted((p for p in self.parts if p.kind != SEND),
                        key=lambda p: (p.node, int(rnd[p.var]), p.chunk, p.n, p.kind != STORE, p.seq))
        position = {p.seq: i for i, p in enumerate(writes)}
        never = len(writes)
        keyed = [(p.node, int(rnd[p.var]), 0, p.peer, position[p.partner.seq] if p.partner else never, p.seq, p)
                 for p in self.parts if p.kind == SEND]
        keyed += [(p.node, int(rnd[p.var]), 1, 0, position[p.seq], p.seq, p) for p in writes]
        keyed.sort(key=lambda x: x[:6])
        ops: list[list[ExplicitOp]] = [[] for _ in range(self.p)]
        origins: list[list[str]] = [[] for _ in range(self.p)]
        for node, r, _, _, _, _, p in keyed:
            ops[node].append(ExplicitOp(r, p.kind, p.peer, p.chunk, p.n, p.remote if p.partner else p.chunk))
            origins[node].append(p.origin)
        total = self.forward_at + max(self.forward_used, default=0)
        e = self.e
        phase = explicit_phase(self.algo.name or "msccl program", ops, ChunkTable.whole(total * e, max(total, 1)))
        coll = self.algo.coll
        if self.inplace:
            regions = Regions(total * e, 0, 0) if coll == "alltoall" else Regions(total * e)
        else:
            regions = Regions(total * e, 0, self.in_chunks * e)
        params = {"source": self.algo.source, "protocol": self.algo.proto, "nchannels": self.algo.nchannels,
                  "nchunksperloop": self.algo.nchunksperloop, "layout": "in-place" if self.inplace else "out-of-place"}
        name = f"msccl:{self.algo.name}" if self.algo.name else f"msccl:{self.algo.source}"

        def origin(node: int, index: int) -> str | None:
            if 0 <= node < len(origins) and 0 <= index < len(origins[node]):
                return origins[node][index]
            return None

        return Schedule(name, coll, self.p, self.count, [phase], root=self.root if coll in ("broadcast", "reduce")
                        else None, params=params, notes=notes, regions=regions, op_origin=origin)


def _find(parent: list[int], x: int) -> int:
    """Union-find root of x (path halving)."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def _components(n: int, edges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Strongly connected components (iterative Tarjan): (component of each vertex, components in topological
    order)."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        adj[u].append(v)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    comp = [-1] * n
    ncomp = 0
    counter = 0
    for start in range(n):
        if index[start] >= 0:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            recurse = False
            while i < len(adj[v]):
                w = adj[v][i]
                i += 1
                if index[w] < 0:
                    work.append((v, i))
                    work.append((w, 0))
                    recurse = True
                    break
                if on_stack[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    # Tarjan numbers components in reverse topological order
    comp = [ncomp - 1 - c for c in comp]
    return comp, list(range(ncomp))


def infer_root(algo: Algorithm) -> int | None:
    """broadcast: the one GPU that never receives; reduce: the one that never sends (None if not unique)."""
    if algo.coll not in ("broadcast", "reduce"):
        return None
    kinds = RECEIVES if algo.coll == "broadcast" else SENDS
    quiet = [g.id for g in algo.gpus if not any(s.type in kinds for tb in g.tbs for s in tb.steps)]
    return quiet[0] if len(quiet) == 1 else None


def lower(algo: Algorithm, count: int | None, inplace: bool, root: int | None) -> Schedule:
    notes = list(algo.notes)
    if algo.coll in ("broadcast", "reduce"):
        if root is None:
            root = algo.root if algo.root is not None else infer_root(algo)
        if root is None:
            root = 0
            notes.append(f"the file names no root and none can be inferred; verified with root {root}")
        if not 0 <= root < algo.ngpus:
            raise ValueError(f"root must be in [0, {algo.ngpus}), got {root}")
    low = _Lowering(algo, count, inplace, root if root is not None else 0)
    low.lower()
    lo, hi = algo.min_bytes, algo.max_bytes
    if lo or hi:
        notes.append(f"the executor picks this file for calls of {lo} to {hi or 'any number of'} bytes "
                     "(minBytes..maxBytes)")
    return low.schedule(notes)
