"""Ring: every rank talks only to its two neighbours, the next (downstream) and the previous (upstream).

Vocabulary. The buffer is cut into p *blocks*, one per rank; pipelining cuts every block into `chunks`
*segments*, and segment s of all blocks travels round the ring as its own wave, started one round after wave
s-1 (so a receiver can reduce one segment while the next is in flight). *Channels* (NCCL's word) are parallel
rings over disjoint slices of every block, each with its own order of the ranks: chunk id =
(block x channels + channel) x chunks + segment, so channel c moves slice c of each block.

* reduce-scatter, p-1 steps: at step k, the rank at ring position q sends the block of position q - k + shift
  downstream and reduce-receives the block of position q - k - 1 + shift from upstream; after p-1 steps it holds
  the block of position q + 1 + shift reduced over all ranks. shift = 0 for allreduce; shift = -1 for
  reduce_scatter, where the block of position q is its own rank's block, as the contract requires.
* allgather, p-1 steps: at step j, position q sends the block of position q + g - j and stores that of position
  q + g - j - 1 from upstream, where g is the block it owns when the allgather starts (g = 1 after the
  reduce-scatter, 0 for a plain allgather, whose input is its own block).

Ring orders (`ring_orders`), as NCCL's graph search builds them (src/graph/search.cc, connect.cc): inside a
scale-up domain every order is as good (every pair meets in the switch); across domains, channel c enters
domain d at its GPU a_d = c + d·(G-1) (mod G), visits the domain's GPUs in local order and leaves from GPU
a_d - 1 = a_{d+1}, which sends to GPU a_{d+1} of the next domain: the same local index, so every crossing stays
on one NIC rail, and the G channels cross every domain boundary on G different rails. NCCL runs one channel pair
per NIC (2 x rails channels, `topology.runtime`): the second channel of a pair repeats the first's ring.

Each rank sends 2(p-1)/p of the buffer for allreduce, the bandwidth-optimal amount over point-to-point links.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send

from ._pipeline import Lane, lane, memo

# a ring of p ranks in c channels costs the analytic model c x p messages per round: the default channel count
# is lowered to keep c x p at most this many (pass channels= to model more), so that a 331,776-GPU call stays
# within the simulator's speed budget (one channel there; all of NCCL's up to tens of thousands of GPUs)
CHANNEL_LANE_BUDGET = 1 << 19


def ring_round(p: int, waves: int, steps: int, step_slots) -> Round:
    """A round pattern in which wave s runs ring step (it - s), for `steps` steps; step_slots(m, step, s, on)."""

    def slots(m, it):
        out = []
        for s in range(waves):
            step = np.asarray(it) - s
            on = (step >= 0) & (step < steps)
            out += step_slots(m, np.minimum(np.maximum(step, 0), max(steps - 1, 0)), s, on)
        return out

    return Round(slots, repeats=(steps + waves - 1) if steps else 0, uniform=waves == 1, name="ring step")


def ring_reduce_scatter_phase(name: str, groups, table: ChunkTable, chunks: int, shift: int) -> Phase:
    """Ring reduce-scatter inside every group (member m = ring position m) over `table` (blocks = members,
    `chunks` segments each): after it, member m holds block (m + 1 + shift) reduced over its group."""
    groups = np.atleast_2d(np.asarray(groups, dtype=np.int64))
    p, c = groups.shape[1], int(chunks)
    assert table.blocks == p and table.sub == c, "a ring phase needs one table block per member"

    def step_slots(m, k, s, on):
        return [send(np.where(on, (m + 1) % p, -1), ((m - k + shift) % p) * c + s),
                recv_reduce(np.where(on, (m - 1) % p, -1), ((m - k - 1 + shift) % p) * c + s)]

    return Phase(name, groups, table, [ring_round(p, c, p - 1, step_slots)])


def ring_allgather_phase(name: str, groups, table: ChunkTable, chunks: int, owned: int) -> Phase:
    """Ring allgather inside every group over `table`: member m starts holding block (m + owned)."""
    groups = np.atleast_2d(np.asarray(groups, dtype=np.int64))
    p, c = groups.shape[1], int(chunks)
    assert table.blocks == p and table.sub == c, "a ring phase needs one table block per member"

    def step_slots(m, j, s, on):
        return [send(np.where(on, (m + 1) % p, -1), ((m + owned - j) % p) * c + s),
                recv(np.where(on, (m - 1) % p, -1), ((m + owned - j - 1) % p) * c + s)]

    return Phase(name, groups, table, [ring_round(p, c, p - 1, step_slots)])


def ring_lanes(groups: np.ndarray, lag: int, block, reduce: bool, owned: int = 0) -> list[Lane]:
    """A ring reduce-scatter (`reduce`: member j ends with block j) or allgather (member j starts with block j
    + owned) inside every group of members `groups` (R, n), as pipelined lanes: step s at lag `lag` + s;
    `block(k, r, b)` is the chunk range of block b of piece k in group r."""
    groups = np.atleast_2d(np.asarray(groups, np.int64))
    R, n = groups.shape
    rep = np.repeat(np.arange(R, dtype=np.int64), n)
    j = np.tile(np.arange(n, dtype=np.int64), R)
    nxt, prv = groups[rep, (j + 1) % n], groups[rep, (j - 1) % n]
    lanes = []
    for s_ in range(n - 1):
        if reduce:  # shift -1: member j sends block j - s - 1, reduce-receives block j - s - 2
            out_b, in_b, kind = (j - s_ - 1) % n, (j - s_ - 2) % n, recv_reduce
        else:
            out_b, in_b, kind = (j + owned - s_) % n, (j + owned - s_ - 1) % n, recv
        lanes.append(lane(send, groups.ravel(), nxt, lag + s_, lambda k, at, b=out_b: block(k, rep[at], b[at])))
        lanes.append(lane(kind, groups.ravel(), prv, lag + s_, lambda k, at, b=in_b: block(k, rep[at], b[at])))
    return lanes


def ring_orders(p: int, channels: int, topology=None) -> np.ndarray:
    """(channels, p): channel c's ranks in ring order (see the module docstring)."""
    ranks = np.arange(p, dtype=np.int64)
    if getattr(topology, "placed", False) and topology.world_size == p and topology.num_domains > 1:
        return _placed_ring_orders(topology, channels)
    G = getattr(topology, "gpus_per_domain", p) if topology is not None else p
    D = p // G if G and p % G == 0 else 1
    if D <= 1 or G == 1:
        return np.stack([np.roll(ranks, -(c % p)) for c in range(channels)])
    d = np.arange(D, dtype=np.int64)[:, None]
    i = np.arange(G, dtype=np.int64)[None, :]
    out = []
    for c in range(channels):
        start = (c % G + d * (G - 1)) % G  # the GPU channel c enters domain d at
        out.append((d * G + (start + i) % G).ravel())
    return np.stack(out)


def _placed_ring_orders(topology, channels: int) -> np.ndarray:
    """ring_orders on a cluster with a placement: domain d's n_d ranks in its local slot order, entered at local
    index (c + d (G - 1)) mod n_d (on equal domains the same rail crossings as consecutive ranks get)."""
    dom = topology.domain_groups()
    D, G = dom.shape
    n = (dom >= 0).sum(axis=1)[:, None]
    d = np.arange(D, dtype=np.int64)[:, None]
    i = np.arange(G, dtype=np.int64)[None, :]
    out = []
    for c in range(channels):
        start = (c % G + d * (G - 1)) % n
        order = np.where(i < n, dom[d, (start + i) % n], -1).ravel()
        out.append(order[order >= 0])
    return np.stack(out)


def channel_phase(name: str, orders: np.ndarray, table: ChunkTable, chunks: int, steps_shift: int,
                  reduce: bool) -> Phase:
    """A ring reduce-scatter (`reduce`, shift `steps_shift`) or allgather (owned `steps_shift`) of every channel
    at once: channel c's position q is rank orders[c, q]; chunk of (rank block r, channel c, segment s) =
    (r x C + c) x chunks + s."""
    C, p = orders.shape
    ch = int(chunks)
    pos = np.empty_like(orders)
    pos[np.arange(C)[:, None], orders] = np.arange(p, dtype=np.int64)[None, :]
    nxt = orders[np.arange(C)[:, None], (pos + 1) % p]  # the rank after each rank, per channel
    prv = orders[np.arange(C)[:, None], (pos - 1) % p]

    def chunk(c, q, s):
        return (orders[c, q % p] * C + c) * ch + s

    def step_slots(m, k, s, on):
        out = []
        for c in range(C):
            q = pos[c, m]
            if reduce:
                out += [send(np.where(on, nxt[c, m], -1), chunk(c, q - k + steps_shift, s)),
                        recv_reduce(np.where(on, prv[c, m], -1), chunk(c, q - k - 1 + steps_shift, s))]
            else:
                out += [send(np.where(on, nxt[c, m], -1), chunk(c, q + steps_shift - k, s)),
                        recv(np.where(on, prv[c, m], -1), chunk(c, q + steps_shift - k - 1, s))]
        return out

    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Phase(name, ranks, table, [ring_round(p, ch, p - 1, step_slots)])


def default_channels(topology, world_size: int) -> int:
    """NCCL's ring channel count on `topology` (topology.runtime), 1 without a runtime; lowered so that
    channels x ranks stays within CHANNEL_LANE_BUDGET."""
    rt = getattr(topology, "runtime", None)
    if rt is None:
        return 1
    return max(1, min(rt.channels("ring"), CHANNEL_LANE_BUDGET // max(world_size, 1)))


@register("ring", ("allreduce", "reduce_scatter", "allgather"),
          summary="ring reduce-scatter and/or allgather; `chunks` pipelines each block into segments; `channels` "
                  "parallel rings striped over the NIC rails (default: NCCL's count)")
def build_ring(collective: str, world_size: int, count: int, *, root=None, topology=None,
               chunks: int = 1, channels: int | None = None) -> Schedule:
    p, c = world_size, check_chunks("ring", chunks)
    C = default_channels(topology, p) if channels is None else check_chunks("ring", channels, "channels")
    work = count * p if collective == "allgather" else count
    table = ChunkTable.whole(work, p, C * c)

    def make() -> list[Phase]:
        orders = ring_orders(p, C, topology)
        phases = []
        if collective in ("allreduce", "reduce_scatter"):
            shift = 0 if collective == "allreduce" else -1
            phases.append(channel_phase("ring reduce-scatter", orders, table, c, shift, reduce=True))
        if collective in ("allreduce", "allgather"):
            owned = 1 if collective == "allreduce" else 0
            phases.append(channel_phase("ring allgather", orders, table, c, owned, reduce=False))
        return phases

    # the rounds count chunks, not elements: kept across the sizes of a sweep (with this size's table)
    made = make() if topology is None else memo(topology, ("ring", p, C, c, collective), make)
    phases = [Phase(ph.name, ph.groups, table, ph.rounds) for ph in made]
    params = {"chunks": c, "channels": C, "latency_class": "ring"}
    return Schedule("ring", collective, p, count, phases, params=params, topology=topology)


__all__ = ["channel_phase", "default_channels", "ring_allgather_phase", "ring_lanes", "ring_orders",
           "ring_reduce_scatter_phase", "ring_round"]
