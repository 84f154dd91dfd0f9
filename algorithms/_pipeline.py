"""Pipelined lanes: the shape every pipelined algorithm here is written in.

Vocabulary. The buffer is cut into `pieces` that stream through the algorithm one round apart. A *lane* is one
slot position of the members' rounds: a kind (send, receive, receive-and-reduce), the members that use it,
each with its *peer* and its *lag*: in round t a member works on piece t - lag (when 0 <= t - lag < pieces), on
the chunk range the lane's `chunks(piece, at)` gives. Stage i of a pipeline is a set of lanes with lag i (per
member: a tree's node of height h sends up at lag h), so any pipeline - NVLS's reduce and multicast, a SHARP
tree's climb and descent, a chain, a tree across domains, and their compositions - is a list of lanes, and
`pipelined_phase` turns it into one phase of fill, steady-state and drain rounds (chain.pipeline_rounds).

Invariants a builder keeps (the verifier checks them): both ends of a message use matching lanes at the same
lag, and a member receives a piece in a strictly earlier round than it forwards it. A range of no chunks is no
message: both ends drop it, so uneven parts cost nothing where they are empty.

Lanes are stored sparsely (only the members that use them), so a round over 331,776 ranks and a few thousand
switch nodes costs its busy members only: a member's program expands its own lanes, a whole round the members
whose lag puts them inside the pipeline (and the slot functions offer those busy members sparse, as
`slots.lanes(it)`, which the analytic simulator reads instead of evaluating every member).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from collectives.schedule import ChunkTable, Phase, Round

ChunkRange = Callable[[np.ndarray, np.ndarray], tuple[object, object]]


def strided(first, count, stride: int) -> ChunkRange:
    """Chunks of piece k: [k * stride + first, + count), `first`/`count` per lane member (or scalars)."""
    first_arr, count_arr = np.asarray(first, np.int64), np.asarray(count, np.int64)

    def chunks(piece, at):
        f = first_arr if first_arr.ndim == 0 else first_arr[at]
        c = count_arr if count_arr.ndim == 0 else count_arr[at]
        return piece * stride + f, c

    return chunks


@dataclass(frozen=True)
class Lane:
    """`kind` (send, recv or recv_reduce) for `members` (member indices, increasing), each with its `peers`
    member and its `lags`; `chunks(piece, at)` gives the chunk range (first, count) of the members at
    positions `at` of this lane for `piece` (arrays alike)."""

    kind: Callable
    members: np.ndarray
    peers: np.ndarray
    lags: np.ndarray
    chunks: ChunkRange
    period: int = 1  # rounds between pieces (1: a piece per round; k: round lag + k x piece, e.g. a unicast)
    count: int | None = None  # every member's chunk count in every piece, where the builder knows it is one
    # number (stages() reads it instead of evaluating `chunks`); None: ask `chunks`

    @property
    def size(self) -> int:
        return int(self.members.size)


def lane(kind: Callable, members, peers, lags, chunks: ChunkRange, period: int = 1, count: int | None = None
         ) -> Lane:
    """A lane over `members` (arrays, or scalars broadcast); members whose peer is < 0 are left out. `chunks`
    is called with positions into the members as given (before members without a peer are dropped). `count`:
    the chunk count `chunks` gives every member for every piece, where the caller knows it is one number."""
    members, peers, lags = _vector(members), _vector(peers), _vector(lags)
    if not members.shape == peers.shape == lags.shape:  # (alike shapes: broadcasting gives the arrays as given)
        members, peers, lags = np.broadcast_arrays(members, peers, lags)
    if bool((peers >= 0).all()) and (members.size < 2 or bool((members[1:] >= members[:-1]).all())):
        # every member kept, already in order (most lanes): the arrays as given (broadcast ones written out)
        members, peers, lags = (np.ascontiguousarray(x) for x in (members, peers, lags))
        return Lane(kind, members, peers, lags, chunks, int(period), count)
    keep = np.flatnonzero(peers >= 0)
    kept = members[keep]
    # the members in increasing order (stable); most lanes list them so already, which a check sees in one pass
    order = keep if kept.size < 2 or bool((kept[1:] >= kept[:-1]).all()) else keep[_member_order(kept)]

    def remapped(piece, at, order=order):
        return chunks(piece, order[at])

    return Lane(kind, members[order], peers[order], lags[order], remapped, int(period), count)


def _vector(x) -> np.ndarray:
    """np.atleast_1d(np.asarray(x, np.int64)): an int64 vector as it is (most lanes' arrays), without the calls."""
    if type(x) is np.ndarray and x.dtype == np.int64 and x.ndim == 1:
        return x
    return np.atleast_1d(np.asarray(x, np.int64))


def _member_order(members: np.ndarray) -> np.ndarray:
    """np.argsort(members, kind="stable"); distinct non-negative members (a replicated lane's, listed replica by
    replica) by scattering each to its value's slot, in linear time (the same permutation: keys are distinct)."""
    top = int(members.max())
    if int(members.min()) >= 0 and top < 4 * members.size + 1024:
        slot = np.full(top + 1, -1, np.int64)
        slot[members] = np.arange(members.size)
        order = slot[slot >= 0]
        if order.size == members.size:  # no member listed twice
            return order
    return np.argsort(members, kind="stable")


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable"); non-negative keys below 2**15 sort as int16, below 256 as uint8 (numpy's
    radix sort: linear time, one pass per byte; the same permutation since both sorts are stable), below 2**30
    as two int16 sorts, the low 15 bits, then the high (least significant digit first: the same permutation)."""
    if keys.size and int(keys.min()) >= 0:
        top = int(keys.max())
        if top < 256:
            return np.argsort(keys.astype(np.uint8), kind="stable")
        if top < np.iinfo(np.int16).max:
            return np.argsort(keys.astype(np.int16), kind="stable")
        if top < 1 << 30:
            low = np.argsort((keys & 0x7FFF).astype(np.int16), kind="stable")
            return low[np.argsort((keys[low] >> 15).astype(np.int16), kind="stable")]
    return np.argsort(keys, kind="stable")


class _Indexed:
    """A lane with its members also sorted by lag, so the members busy in round t are one slice. The order is
    found on the first `busy` call: the analytic simulator's bulk model of a huge pipeline reads its stages
    (`info["stages"]`) and never a round's members, so it never sorts them."""

    def __init__(self, ln: Lane) -> None:
        self.lane = ln
        self._order: tuple[np.ndarray, np.ndarray] | None = None

    def _by_lag(self) -> tuple[np.ndarray, np.ndarray]:
        if self._order is None:
            ln = self.lane
            if ln.size and int(ln.lags.min()) == int(ln.lags.max()):  # one lag (most lanes): already in order
                self._order = np.arange(ln.size, dtype=np.int64), ln.lags
            else:
                by_lag = _stable_order(ln.lags)
                self._order = by_lag, ln.lags[by_lag]
        return self._order

    @property
    def by_lag(self) -> np.ndarray:
        """Positions of the lane's members in increasing lag (stable)."""
        return self._by_lag()[0]

    @property
    def sorted_lags(self) -> np.ndarray:
        return self._by_lag()[1]

    def busy(self, t: int, pieces: int) -> np.ndarray:
        """Positions (into the lane's members) of the members working on a piece in round t."""
        per = self.lane.period
        by_lag, sorted_lags = self._by_lag()
        lo = np.searchsorted(sorted_lags, t - per * (pieces - 1), side="left")
        hi = np.searchsorted(sorted_lags, t, side="right")
        at = by_lag[lo:hi]
        if per > 1:
            at = at[(t - self.lane.lags[at]) % per == 0]
        return at


_INDEX: dict[tuple, tuple] = {}


def _index(lanes: list[Lane], M: int, pieces: int):
    """The lanes sorted by lag, the last lag, and a function giving each member's earliest and latest lag (for
    Round.window: a member's program visits its own rounds only; computed on its first call, which only
    program expansion makes); kept per lanes object while periodic lanes are absent (their spans depend on
    `pieces`)."""
    periodic = any(ln.period > 1 for ln in lanes)
    key = (id(lanes), M, pieces if periodic else None)
    hit = _INDEX.get(key)
    if hit is not None and hit[0] is lanes:
        return hit[1]
    indexed = [_Indexed(ln) for ln in lanes]
    top = max((int(ln.lags.max()) + (ln.period - 1) * (pieces - 1) for ln in lanes if ln.size), default=-1)
    spans: list = []

    def lag_spans() -> tuple[np.ndarray, np.ndarray]:
        if not spans:
            lo_lag = np.full(M, np.iinfo(np.int64).max, np.int64)
            hi_lag = np.full(M, -1, np.int64)
            for ln in lanes:
                if ln.size:
                    np.minimum.at(lo_lag, ln.members, ln.lags)
                    np.maximum.at(hi_lag, ln.members, ln.lags + (ln.period - 1) * (pieces - 1))
            spans.append((lo_lag, hi_lag))
        return spans[0]

    value = (indexed, top, lag_spans)
    if len(_INDEX) >= MEMO_MAX:
        _INDEX.pop(next(iter(_INDEX)))
    _INDEX[key] = (lanes, value)
    return value


def _member_lanes(lanes: list[Lane], M: int) -> tuple[list[int], list[int], list[int]]:
    """Every member's lanes, so a member's program visits only those: entries (lane index, position of the
    member in the lane) grouped by member and, per member, in the lanes' order; member m's entries are
    [ptr[m], ptr[m + 1]). A member listed twice in a lane keeps its first position (as a search would find)."""
    sizes = [ln.size for ln in lanes]
    members = np.concatenate([ln.members for ln in lanes]) if lanes else np.zeros(0, np.int64)
    lane_of = np.repeat(np.arange(len(lanes), dtype=np.int64), sizes)
    pos_of = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes]) if lanes else np.zeros(0, np.int64)
    order = np.argsort(members, kind="stable")  # lane-major input: per member, lanes in order
    members, lane_of, pos_of = members[order], lane_of[order], pos_of[order]
    first = np.r_[True, (members[1:] != members[:-1]) | (lane_of[1:] != lane_of[:-1])] if members.size else \
        np.zeros(0, bool)
    members, lane_of, pos_of = members[first], lane_of[first], pos_of[first]
    ptr = np.searchsorted(members, np.arange(M + 1), side="left")
    return ptr.tolist(), lane_of.tolist(), pos_of.tolist()


def _piece(t, lag, period: int):
    """The piece a member of lag `lag` works on in round t (-1 between pieces of a periodic lane)."""
    d = np.asarray(t) - lag
    if period == 1:
        return d
    return np.where(d % period == 0, d // period, -1)


_MEMO: dict[tuple, tuple] = {}
MEMO_MAX = 64


def memo(topology, key: tuple, make):
    """`make()` once per (topology object, key): builders keep the lanes of a large pipeline, which do not depend
    on the buffer's size, across the sizes of a sweep (the key names everything else they depend on)."""
    full = (id(topology),) + tuple(key)
    hit = _MEMO.get(full)
    if hit is not None and hit[0] is topology:
        return hit[1]
    value = make()
    if len(_MEMO) >= MEMO_MAX:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[full] = (topology, value)
    return value


def pipelined_phase(name: str, nodes: np.ndarray, table: ChunkTable, lanes: list[Lane], pieces: int,
                    piece_invariant: bool = False) -> Phase:
    """One phase in which member m (node nodes[m]) runs every lane it belongs to, piece t - lag in round t.

    `table` must hold every chunk the lanes name. The rounds are those of chain.pipeline_rounds: fill and drain
    rounds apart, the steady state (every stage busy with an equally sized piece) one uniform round.
    `piece_invariant`: every piece moves the same chunk counts on every lane (a piece-major table), so the
    stages' costs do not depend on `pieces` (the analytic simulator then shares them across piece counts).
    """
    nodes = np.asarray(nodes, np.int64)
    M = nodes.size
    indexed, top, lag_spans = _index(lanes, M, pieces)
    periodic = any(ln.period > 1 for ln in lanes)

    member_lanes = []  # filled on the first one_member call: (bounds per member, lane, position per entry)

    def one_member(m: int, t):
        if not member_lanes:
            member_lanes.append(_member_lanes(lanes, M))
        ptr, lane_of, pos_of = member_lanes[0]
        rounds = np.asarray(t)
        if rounds.size == 0:
            return []
        t_first, t_last = int(rounds.min()), int(rounds.max())
        out = []
        for j in range(ptr[m], ptr[m + 1]):  # m's lanes, in the lanes' order
            ln, at = lanes[lane_of[j]], pos_of[j]
            lag = int(ln.lags[at])
            if lag > t_last or lag + ln.period * (pieces - 1) < t_first:
                continue  # no piece of this lane in these rounds: an idle slot, left out
            piece = _piece(t, lag, ln.period)
            on = (piece >= 0) & (piece < pieces)
            safe = np.minimum(np.maximum(piece, 0), max(pieces - 1, 0))
            first, count = ln.chunks(safe, np.int64(at))
            on = on & (np.asarray(count) > 0)  # a range of no chunks is no message (at both ends alike)
            out.append(ln.kind(np.where(on, ln.peers[at], -1), first, count))
        return out

    def every_member(m: np.ndarray, t: int):
        full = m.size == M and (M == 0 or (m[0] == 0 and m[-1] == M - 1))
        out = []
        for ix in indexed:
            ln = ix.lane
            at = ix.busy(t, pieces)
            if at.size and not full:
                pos = np.searchsorted(m, ln.members[at])
                hit = (pos < m.size) & (m[np.minimum(pos, m.size - 1)] == ln.members[at])
                at, pos = at[hit], pos[hit]
            elif at.size:
                pos = ln.members[at]
            if at.size == 0:
                out.append(ln.kind(-1, 0))
                continue
            first, count = ln.chunks(_piece(t, ln.lags[at], ln.period), at)
            first, count = np.broadcast_to(first, at.shape), np.broadcast_to(count, at.shape)
            some = count > 0  # a range of no chunks is no message (at both ends alike)
            if not some.all():
                at, pos, first, count = at[some], pos[some], first[some], count[some]
                if at.size == 0:
                    out.append(ln.kind(-1, 0))
                    continue
            peer = np.full(m.size, -1, np.int64)
            peer[pos] = ln.peers[at]
            chunk = np.zeros(m.size, np.int64)
            chunk[pos] = first
            n = np.zeros(m.size, np.int64)
            n[pos] = count
            out.append(ln.kind(peer, chunk, n))
        return out

    def slots(m, t):
        if np.ndim(m) == 0:
            return one_member(int(m), t)
        if np.ndim(t) != 0:
            raise ValueError("pipelined lanes evaluate one member over many rounds, or many members in one round")
        return every_member(np.asarray(m, np.int64), int(t))

    def busy_lanes(t: int):
        """The round's messages lane by lane, sparse: [(kind, members, peers, nchunks)] of the busy members
        (what slots(arange(M), t) says, without its dense per-member arrays)."""
        out = []
        for ix in indexed:
            ln = ix.lane
            at = ix.busy(t, pieces)
            if at.size == 0:
                continue
            _, count = ln.chunks(_piece(t, ln.lags[at], ln.period), at)
            count = np.broadcast_to(count, at.shape)
            some = count > 0
            out.append((ln.kind(-1, 0).kind, ln.members[at[some]], ln.peers[at[some]], count[some]))
        return out

    def window(m: int) -> tuple[int, int]:
        lo_lag, hi_lag = lag_spans()
        if hi_lag[m] < 0:
            return 0, 0
        return int(lo_lag[m]), int(hi_lag[m]) + pieces

    def stages():
        """Every lane's messages at once, with each member's lag (piece 0's chunk counts): what a round of the
        steady state moves, stage by stage, for the analytic simulator's bulk costing of huge pipelines."""
        out = []
        # piece 0 and the positions of the members of every lane without one count: slices of one read-only pair
        widest = max((ln.size for ln in lanes if ln.count is None or ln.count <= 0), default=0)
        piece_zero, positions = np.zeros(widest, np.int64), np.arange(widest, dtype=np.int64)
        piece_zero.flags.writeable = positions.flags.writeable = False
        for ln in lanes:
            if ln.size == 0:
                continue
            if ln.count is not None and ln.count > 0:  # every member moves the lane's one count: none left out
                out.append((ln.kind(-1, 0).kind, ln.members, ln.peers, ln.lags,
                            np.broadcast_to(ln.count, ln.members.shape)))
                continue
            _, count = ln.chunks(piece_zero[:ln.size], positions[:ln.size])
            one_count = np.ndim(count) == 0 and count > 0  # every member moves the same chunks: none left out
            count = np.broadcast_to(count, ln.members.shape)
            if one_count or bool((some := count > 0).all()):  # every member moves chunks (the usual case)
                out.append((ln.kind(-1, 0).kind, ln.members, ln.peers, ln.lags, count))
                continue
            out.append((ln.kind(-1, 0).kind, ln.members[some], ln.peers[some], ln.lags[some], count[some]))
        return out

    info = {"key": (id(lanes),) if piece_invariant else (id(lanes), pieces), "lanes": lanes, "stages": stages,
            "pieces": pieces, "stage_count": top + 1}
    if periodic:  # rounds differ with t mod period: one non-uniform pattern
        rounds = [Round(_offset(slots, busy_lanes, 0), repeats=top + pieces if pieces else 0, name=name,
                        window=window)]
        return Phase(name, _row(nodes), table, rounds)
    return Phase(name, _row(nodes), table,
                 _pipeline_rounds(slots, busy_lanes, top + 1, pieces, name, window, info))


def _row(nodes: np.ndarray) -> np.ndarray:
    """nodes[None, :], one view per nodes array: the builds of a sweep's sizes over one member array share their
    phases' groups (the simulator keeps what it derives from a groups array per array). A kept view keeps its
    member array alive: the most recent MEMO_MAX arrays, which the builders' memos keep alive anyway."""
    hit = _ROWS.get(id(nodes))
    if hit is not None and hit[0]() is nodes:
        return hit[1]
    row = nodes[None, :]
    if len(_ROWS) >= MEMO_MAX:
        _ROWS.pop(next(iter(_ROWS)))
    _ROWS[id(nodes)] = (weakref.ref(nodes), row)
    return row


_ROWS: dict[int, tuple] = {}


def _offset(slots, busy_lanes, lo: int, info: dict | None = None):
    """slots(m, it) of global round it + lo, with its sparse `lanes(it)` and, for a pipeline without periodic
    lanes, `pipeline` (its stages and the round's first global index): optional fast paths the analytic
    simulator uses (flows.round_flows, analytic.structure)."""

    def shifted(m, it):
        return slots(m, np.asarray(it) + lo)

    shifted.lanes = lambda it: busy_lanes(int(it) + lo)
    if info is not None:
        shifted.pipeline = {**info, "first": lo}
    return shifted


def _pipeline_rounds(slots, busy_lanes, stages: int, chunks: int, name: str, window, info=None) -> list[Round]:
    """chain.pipeline_rounds (fill, uniform steady state, drain) with slot functions that offer `lanes`."""
    if stages == 0:
        return [Round(slots, repeats=0, name=name)]
    cuts = (0, stages - 1, max(stages - 1, chunks), chunks + stages - 1)
    rounds = []
    for lo, hi, part in zip(cuts[:-1], cuts[1:], ("fill", "steady state", "drain"), strict=True):
        if hi > lo:
            local = lambda m, lo=lo: tuple(t - lo for t in window(m))  # noqa: E731
            rounds.append(Round(_offset(slots, busy_lanes, lo, info), repeats=hi - lo,
                                uniform=part == "steady state", name=f"{name}, {part}", window=local))
    return rounds


__all__ = ["Lane", "lane", "memo", "pipelined_phase", "strided"]
