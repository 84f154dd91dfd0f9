"""Uneven domains: a cluster whose domains hold different numbers of ranks (3 + 2, 4 + 4 + 1) runs a
hierarchical allreduce on its *core* and *folds* the rest onto it.

Vocabulary. The cluster's placement (topology/cluster.py) puts ranks in the slots of D domains x G GPUs; domain d
holds n_d ranks in its first n_d slots (`domain_groups()`: -1 in the empty ones). The *core* is the first
g = min(n_d) slots of every domain: D equal domains of g GPUs, which every hierarchical schedule serves as it is
(a `CoreView` of the topology shows the builders only the core). Every other rank is an *extra*: the rank in
slot l >= g of domain d folds onto its *partner*, the core rank in slot l mod g of the same domain.

* fold: every extra sends its buffer to its partner, which reduce-receives the copies of all its extras at once;
* the core runs the hierarchical allreduce (its partners' buffers now stand for their extras too);
* unfold: every partner sends the result to its extras.

When the core's schedule is one pipeline (the pipelined builders: a piece-major table, `pipelined_phase`), the
fold and the unfold join it as its first and last stages, piece by piece (lag 0 and the last lag + 1), so they
overlap the core's stages; otherwise (host inter stages run one after another) they are a phase before and a
phase after, each one round over the whole buffer. Extras cost one buffer each way over NVLink and their
partners' reductions; the fabric carries 1/g of the buffer per GPU instead of 1/G. Scattered (round-robin) domains of equal size need no fold: the builders read
the domain table, so their schedules are those of consecutive domains with the ranks relabelled. Without a
placement nothing here runs and every schedule is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from collectives.schedule import BlockTable, ChunkTable, Phase, recv, recv_reduce, send

from ._alltoall_placed import MessageLists
from ._pipeline import lane, memo, pipelined_phase


def layout_text(topology) -> str:
    """The domains' sizes, "3+2", for messages."""
    sizes = getattr(topology, "domain_sizes", ())
    return "+".join(map(str, sizes)) if len(sizes) <= 16 else f"{min(sizes)}..{max(sizes)} ranks per domain"


def needs_core(topology) -> bool:
    """Whether some domain has empty slots (the builders then run on the core)."""
    return bool(getattr(topology, "placed", False)) and min(topology.domain_sizes) < topology.gpus_per_domain


class CoreView:
    """The topology as the builders of a hierarchical schedule see it: every query is the cluster's, but the
    domains are the core's (D domains of g GPUs, the first g slots of each)."""

    def __init__(self, topology) -> None:
        self._topology = topology
        self.gpus_per_domain = g = int(min(topology.domain_sizes))
        self.domain_sizes = (g,) * topology.num_domains
        self._table = topology.domain_groups()[:, :g].copy()

    def domain_groups(self) -> np.ndarray:
        return self._table.copy()

    def __getattr__(self, name: str):
        return getattr(self._topology, name)


def core_view(topology) -> CoreView:
    """The topology's CoreView, one per topology (so the builders' memos hit across a sweep's sizes)."""
    return memo(topology, ("core view",), lambda: CoreView(topology))


def fold_lanes(topology, unfold: bool, lag: int = 0, piece=lambda k: (0, 1)) -> list:
    """Lanes of the fold (extras -> partners, reduced) or the unfold (partners -> extras), one pair of lanes per
    *tier* (slots [t g, (t + 1) g) of every domain), so a partner meets each of its extras on its own lane."""
    dom = topology.domain_groups()
    g = int(min(topology.domain_sizes))
    whole = lambda k, at: piece(k)  # noqa: E731  (every member moves piece k: the whole buffer by default)
    lanes = []
    for t in range(1, -(-dom.shape[1] // g)):
        extras = dom[:, t * g:(t + 1) * g]
        partners = dom[:, :extras.shape[1]]
        present = extras >= 0
        x, p = extras[present], partners[present]
        if x.size == 0:
            continue
        if unfold:
            lanes += [lane(send, p, x, lag, whole), lane(recv, x, p, lag, whole)]
        else:
            lanes += [lane(send, x, p, lag, whole), lane(recv_reduce, p, x, lag, whole)]
    return lanes


def fold_phases(topology, work: int) -> tuple[list, list]:
    """([fold phase], [unfold phase]) over the work buffer; empty lists when no domain has extras."""
    nodes = np.arange(topology.world_size, dtype=np.int64)
    fold = memo(topology, ("fold lanes", False), lambda: fold_lanes(topology, False))
    if not fold:
        return [], []
    unfold = memo(topology, ("fold lanes", True), lambda: fold_lanes(topology, True))
    table = ChunkTable.whole(work, 1)
    return ([pipelined_phase("fold extras onto the core", nodes, table, fold, 1)],
            [pipelined_phase("unfold: the core's result to the extras", nodes, table, unfold, 1)])


def unfold_blocks_phase(topology, work: int):
    """The unfold of a reduce_scatter: every partner sends each of its extras that extra's block (of p)."""
    dom = topology.domain_groups()
    g = int(min(topology.domain_sizes))
    p = topology.world_size

    def make():
        lanes = []
        for t in range(1, -(-dom.shape[1] // g)):
            extras = dom[:, t * g:(t + 1) * g]
            present = extras >= 0
            x, partner = extras[present], dom[:, :extras.shape[1]][present]
            own = lambda k, at, x=x: (x[at], 1)  # noqa: E731  (chunk r: rank r's block)
            lanes += [lane(send, partner, x, 0, own), lane(recv, x, partner, 0, own)]
        return lanes

    lanes = memo(topology, ("unfold blocks",), make)
    return pipelined_phase("unfold: each extra's block from the core", np.arange(p, dtype=np.int64),
                           ChunkTable.whole(work, p), lanes, 1)


def holders_phase(p: int, dom: np.ndarray, count: int) -> Phase:
    """The first phase of an allgather on the core (D domains of g; `dom` the core's table): every rank's block
    to the core ranks that hold it for the inter-domain stage. Chunk j·D + d of ChunkTable.whole(work, g, D)
    (part d of shard j) is held by dom[d, j]; a block straddles at most two such parts (each is at least a
    block long, since p >= g·D), so a rank sends at most two messages and a holder receives its part's pieces
    from their owners. Without extras this is transpose_phase's pattern (hierarchical.py)."""
    D, g = dom.shape
    work = count * p
    parts = ChunkTable.whole(work, g, D)
    ids = np.arange(g * D + 1, dtype=np.int64)
    part_start, part_stop = parts.elements(0, ids[:-1], ids[1:])
    cuts = np.unique(np.concatenate([part_start, part_stop, np.arange(p + 1, dtype=np.int64) * count]))
    cuts = cuts[(cuts >= 0) & (cuts <= work)]
    starts = cuts[:-1]
    owner = starts // max(count, 1)
    holder = dom.T.ravel()[np.searchsorted(part_stop, starts, side="right")]  # part j·D + d: dom[d, j]
    messages = MessageLists(p)
    for piece in np.flatnonzero(owner != holder).tolist():
        messages.add(int(owner[piece]), int(holder[piece]), piece, piece)
    if starts.size == 0:
        table = ChunkTable.whole(work, 1)
    else:
        table = BlockTable(lambda grp, m, c: (cuts[c], cuts[c + 1] - cuts[c]), int(starts.size), length=work)
    return Phase("blocks to their holders", np.arange(p, dtype=np.int64)[None, :], table,
                 [messages.round("blocks to their holders")])


def _pipeline_of(sched):
    """(nodes, table, lanes, pieces) of a schedule that is one piece-major pipeline, else None."""
    if len(sched.phases) != 1:
        return None
    phase = sched.phases[0]
    info = [getattr(r.slots, "pipeline", None) for r in phase.rounds]
    if not info or any(i is None for i in info) or len(info[0]["key"]) != 1:  # key (lanes,): piece-invariant
        return None
    return phase.groups[0], phase.chunks, info[0]["lanes"], int(info[0]["pieces"])


def folded_pipeline(topology, sched) -> bool:
    """Put the fold and the unfold into `sched`'s pipeline as its first and last stages; False if it is not one
    piece-major pipeline (a piece is nchunks / pieces consecutive chunks)."""
    found = _pipeline_of(sched)
    if found is None:
        return False
    nodes, table, lanes, pieces = found
    per = table.nchunks // pieces
    piece = lambda k: (k * per, per)  # noqa: E731

    def make():
        top = max((int(ln.lags.max()) for ln in lanes if ln.size), default=-1)
        shifted = [dataclasses.replace(ln, lags=ln.lags + 1) for ln in lanes]
        return fold_lanes(topology, False, 0, piece) + shifted + fold_lanes(topology, True, top + 2, piece)

    kept = memo(topology, ("folded pipeline", id(lanes), per), lambda: (lanes, make()))
    every = kept[1] if kept[0] is lanes else make()  # (an id reused after the memo dropped the first lanes)
    name = f"fold + {sched.phases[0].name} + unfold"
    sched.phases = [pipelined_phase(name, nodes, table, every, pieces, piece_invariant=True)]
    return True


def serves_uneven(name: str, allgather: bool = False):
    """Decorate a hierarchical allreduce builder so that it serves clusters with empty slots: it builds the
    schedule on the core (CoreView) between the fold and the unfold. A reduce_scatter (of a builder that has one)
    runs as the core's allreduce of the whole input, each extra then getting its block. `allgather`: the builder
    builds an allgather on a CoreView itself (every block to its holder in the core: `holders_phase`), and the
    core then sends the result to the extras. Other collectives are refused there, with the layout in the
    message."""

    def wrap(build):
        @functools.wraps(build)
        def built(collective: str, world_size: int, count: int, *, topology=None, **kwargs):
            if topology is None or not needs_core(topology):
                return build(collective, world_size, count, topology=topology, **kwargs)
            if collective == "reduce_scatter":
                return _reduce_scatter(name, build, world_size, count, topology, kwargs)
            if collective == "allgather" and allgather:
                return _allgather(build, world_size, count, topology, kwargs)
            if collective != "allreduce":
                raise ValueError(
                    f"{name} {collective} needs every domain to hold the same number of ranks; {topology.name!r} "
                    f"has domains of {layout_text(topology)}. Use a flat algorithm (ring, pat, one_shot) or equal "
                    f"domains; {name}'s allreduce serves these domains (the extra ranks fold onto the domains' "
                    f"first {min(topology.domain_sizes)})")
            sched = build(collective, world_size, count, topology=core_view(topology), **kwargs)
            sched.topology = topology
            sched.params["domain_sizes"] = list(topology.domain_sizes)
            if "fallback" in sched.params:  # a flat host algorithm over every rank stood in: nothing to fold
                return sched
            fold, unfold = fold_phases(topology, count)
            if fold and not folded_pipeline(topology, sched):
                sched.phases = fold + sched.phases + unfold
            if fold:
                sched.notes.append(f"domains of {layout_text(topology)} ranks: the extra ranks fold onto the first "
                                   f"{min(topology.domain_sizes)} of their domain, which run the schedule")
            return sched

        return built

    return wrap


def _allgather(build, world_size: int, count: int, topology, kwargs: dict):
    """An allgather on uneven domains: the core's allgather (its first phase takes the extras' blocks too), then
    the whole result from every partner to its extras."""
    sched = build("allgather", world_size, count, topology=core_view(topology), **kwargs)
    sched.topology = topology
    sched.params["domain_sizes"] = list(topology.domain_sizes)
    if "fallback" in sched.params:
        return sched
    _, unfold = fold_phases(topology, count * world_size)
    if unfold:
        sched.phases = sched.phases + unfold
        sched.notes.append(f"domains of {layout_text(topology)} ranks: every block goes to its holder among the "
                           f"first {min(topology.domain_sizes)} ranks of every domain, which allgather; the "
                           "others then get the result from their partner")
    return sched


def _reduce_scatter(name: str, build, world_size: int, count: int, topology, kwargs: dict):
    """A reduce_scatter on uneven domains: the fold, the core's allreduce of the whole input (every core rank
    ends with every block), each extra's block back to it."""
    from collectives.schedule import Schedule

    inner = build("allreduce", world_size, count, topology=core_view(topology), **kwargs)
    notes = list(inner.notes)
    phases = inner.phases
    if "fallback" not in inner.params:
        fold, _ = fold_phases(topology, count)
        phases = fold + phases + ([unfold_blocks_phase(topology, count)] if fold else [])
    notes.append(f"domains of {layout_text(topology)} ranks: reduce_scatter runs as an allreduce of the first "
                 f"{min(topology.domain_sizes)} ranks of every domain (the others fold onto them and get their "
                 "block back): twice a reduce_scatter's fabric traffic")
    params = {**inner.params, "domain_sizes": list(topology.domain_sizes), "as_allreduce": True}
    sched = Schedule(inner.algorithm, "reduce_scatter", world_size, count, phases, num_nodes=inner.num_nodes,
                     params=params, node_labels=dict(inner.node_labels), notes=notes, topology=topology)
    return sched


__all__ = ["CoreView", "core_view", "fold_phases", "holders_phase", "layout_text", "needs_core", "serves_uneven"]
