"""The symbolic verifier: proves a schedule correct for its world size and count, or names what is wrong.

It expands every node's program and checks, in order:

1. every operation is well formed (peer exists, its own range and the peer's range inside the work buffer);
2. every send meets exactly one receive *in the same round*, matched in program order per (sender, receiver)
   pair as MPI matches messages (a node's messages to itself, its local copies and reductions, match the same
   way), and both ends name the same two ranges: the send's `remote` is where the receive writes, the receive's
   `remote` is where the send reads, and the lengths agree. Same-round matching is the IR's contract and is what
   makes the transport's blocking order deadlock-free: a node posts all operations of a round and waits for
   them, and every partner posts the matching operation in that same round. When the rounds of a send and its
   receive differ, the verifier replays the blocking order to tell a deadlock (and its cycle) from a merely
   misaligned pair;
3. symbolic execution with provenance: every element of every node carries the set of ranks whose input it
   holds (a bitset, plus an "undefined" bit for never-written memory) and the index of the input element it
   stands for. A store copies both; a reduce unites the sets and fails on an overlap (a contribution counted
   twice), on undefined data, or on operands that stand for different input elements. At the end each rank's
   output must hold exactly what the contract says (`schedule.output_blocks`): which ranks, which elements.
   So a schedule that moves the right rank's data to the wrong place fails too.

Symbolic execution runs one round at a time over all nodes with numpy, on the elementary segments cut by all
operations' boundaries (closed under the shifts of messages whose ends sit at different offsets), so its cost
follows the number of chunks, not the element count. Errors name node, op index, round and elements, and for an
imported program the step it came from (`schedule.origin`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import ScheduleError
from .schedule import OpKind, Schedule
from .schedule.expand import OpTable, expand, pair_messages

_MEMORY_LIMIT = 3 << 30  # bytes of symbolic state before we refuse (ask for a smaller count or world)


@dataclass
class VerifyReport:
    """What a verified schedule does, for elements of `itemsize` bytes.

    `messages` and the byte counts are messages between distinct nodes; `local_steps` counts a node's messages
    to itself (local copies and reductions), which move no data over any link."""

    algorithm: str
    collective: str
    world_size: int
    count: int
    num_nodes: int
    steps: int  # rounds in which at least one message moves
    messages: int
    itemsize: int
    bytes_sent: np.ndarray = field(repr=False)  # per node
    bytes_received: np.ndarray = field(repr=False)
    local_steps: int = 0

    @property
    def max_bytes_sent_per_rank(self) -> int:
        return int(self.bytes_sent[: self.world_size].max(initial=0))

    def summary(self) -> str:
        local = f", {self.local_steps} local steps" if self.local_steps else ""
        return (f"{self.algorithm} {self.collective} p={self.world_size} count={self.count}: OK, "
                f"{self.steps} steps, {self.messages} messages{local}, max {self.max_bytes_sent_per_rank} B sent "
                "per rank")


def _where(t: OpTable, row: int) -> str:
    origin = t.origin(int(t.node[row]), int(t.index[row])) if t.origin is not None else None
    return f" [{origin}]" if origin else ""


def _fail(message: str, table: OpTable | None = None, row: int | None = None) -> ScheduleError:
    if table is None or row is None:
        return ScheduleError(message)
    node, idx = int(table.node[row]), int(table.index[row])
    a, b = int(table.start[row]), int(table.stop[row])
    return ScheduleError(f"node {node}, op {idx} (round {int(table.round[row])}, elements [{a}, {b})){_where(table, row)}"
                         f": {message}", node=node, op_index=idx, round=int(table.round[row]), elements=(a, b))


def _check_well_formed(s: Schedule, t: OpTable) -> None:
    bad = (t.peer < 0) | (t.peer >= s.num_nodes)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise _fail(f"peer {int(t.peer[r])} does not exist (nodes are 0..{s.num_nodes - 1})", t, r)
    bad = (t.start < 0) | (t.stop < t.start) | (t.stop > s.work_size)
    if bad.any():
        raise _fail(f"element range outside the work buffer [0, {s.work_size})", t, int(np.flatnonzero(bad)[0]))
    bad = (t.remote < 0) | (t.remote + t.stop - t.start > s.work_size)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise _fail(f"the peer's range [{int(t.remote[r])}, {int(t.remote[r] + t.stop[r] - t.start[r])}) lies outside "
                    f"its work buffer [0, {s.work_size})", t, r)
    if len(t) > 1:
        order_bad = (t.node[1:] == t.node[:-1]) & (t.round[1:] < t.round[:-1])
        if order_bad.any():
            raise _fail("operations are not in round order", t, int(np.flatnonzero(order_bad)[0]) + 1)


def _unmatched_message(t: OpTable) -> ScheduleError:
    """Name the first send without a receive (or receive without a send), matching per pair in order."""
    from collections import defaultdict, deque

    sends: dict[tuple[int, int], deque] = defaultdict(deque)
    recvs: dict[tuple[int, int], deque] = defaultdict(deque)
    for r in range(len(t)):
        if t.kind[r] == OpKind.SEND:
            sends[(int(t.node[r]), int(t.peer[r]))].append(r)
        else:
            recvs[(int(t.peer[r]), int(t.node[r]))].append(r)
    for pair in sorted(set(sends) | set(recvs)):
        s, r = sends.get(pair, deque()), recvs.get(pair, deque())
        if len(s) > len(r):
            row = s[len(r)]
            return _fail(f"send to node {pair[1]} has no matching receive on node {pair[1]} "
                         f"({len(s)} sends from {pair[0]} to {pair[1]}, {len(r)} receives)", t, row)
        if len(r) > len(s):
            row = r[len(s)]
            return _fail(f"receive from node {pair[0]} has no matching send on node {pair[0]} "
                         f"({len(s)} sends from {pair[0]} to {pair[1]}, {len(r)} receives)", t, row)
    return ScheduleError("messages do not match")  # pragma: no cover - counts differ so a pair differs


def _check_ends(t: OpTable, send_rows: np.ndarray, recv_rows: np.ndarray) -> None:
    """Both ends of every matched message name the same two ranges."""
    ls, lr = t.stop[send_rows] - t.start[send_rows], t.stop[recv_rows] - t.start[recv_rows]
    differ = (ls != lr) | (t.remote[send_rows] != t.start[recv_rows]) | (t.remote[recv_rows] != t.start[send_rows])
    if not differ.any():
        return
    i = int(np.flatnonzero(differ)[0])
    r, q = int(send_rows[i]), int(recv_rows[i])
    peer = int(t.peer[r])
    delivers = (f"to land at node {peer}'s [{int(t.remote[r])}, {int(t.remote[r] + ls[i])}) " if
                int(t.remote[r]) != int(t.start[r]) else "")
    reads = (f" (read from this node's [{int(t.remote[q])}, {int(t.remote[q] + lr[i])}))"
             if int(t.remote[q]) != int(t.start[q]) else "")
    raise _fail(f"sends elements [{int(t.start[r])}, {int(t.stop[r])}) {delivers}but node {peer}'s matching receive "
                f"(its op {int(t.index[q])}){_where(t, q)} expects [{int(t.start[q])}, {int(t.stop[q])}){reads}; both "
                "ends of a message must name the same two ranges", t, r)


def _replay_blocking_order(t: OpTable, send_rows: np.ndarray, recv_rows: np.ndarray) -> ScheduleError:
    """Rounds of some matched pair differ: replay the transport's order and report a deadlock or misalignment.

    Each node posts all ops of its current round and waits for them; an op completes once its partner has
    reached the round holding the matching op (rendezvous: a send needs its receive posted too).
    """
    partner = np.empty(len(t), dtype=np.int64)
    partner[send_rows] = recv_rows
    partner[recv_rows] = send_rows
    num_nodes = int(t.node.max()) + 1 if len(t) else 0
    rows_of: list[list[int]] = [[] for _ in range(num_nodes)]
    for r in range(len(t)):
        rows_of[int(t.node[r])].append(r)
    rounds_of = [sorted({int(t.round[r]) for r in rows}) for rows in rows_of]
    pos = [0] * num_nodes  # index into rounds_of[node] of the round being executed

    def current(n: int) -> float:
        return rounds_of[n][pos[n]] if pos[n] < len(rounds_of[n]) else float("inf")

    progress = True
    while progress:
        progress = False
        for n in range(num_nodes):
            if pos[n] >= len(rounds_of[n]):
                continue
            rnd = current(n)
            rows = [r for r in rows_of[n] if t.round[r] == rnd]
            if all(current(int(t.node[partner[r]])) >= t.round[partner[r]] for r in rows):
                pos[n] += 1
                progress = True
    stuck = [n for n in range(num_nodes) if pos[n] < len(rounds_of[n])]
    if not stuck:
        r = next(int(r) for r in send_rows if t.round[r] != t.round[partner[r]])
        return _fail(f"this message is received by node {int(t.peer[r])} in round {int(t.round[partner[r]])} "
                     f"(its op {int(t.index[partner[r]])}){_where(t, int(partner[r]))}; both ends of a message must "
                     "be in the same round", t, r)
    # follow wait-for edges from a stuck node until a node repeats: that is the cycle
    def waits_on(n: int) -> int:
        rnd = current(n)
        for r in rows_of[n]:
            if t.round[r] == rnd and current(int(t.node[partner[r]])) < t.round[partner[r]]:
                return r
        raise AssertionError("stuck node waits on nothing")  # pragma: no cover

    seen: dict[int, int] = {}
    chain: list[int] = []
    n = stuck[0]
    while n not in seen:
        seen[n] = len(chain)
        r = waits_on(n)
        chain.append(r)
        n = int(t.peer[r])
    cycle = chain[seen[n]:]
    steps = "; ".join(f"node {int(t.node[r])} op {int(t.index[r])} (round {int(t.round[r])}){_where(t, r)} waits for "
                      f"node {int(t.peer[r])}'s op {int(t.index[partner[r]])} in round {int(t.round[partner[r]])}"
                      f"{_where(t, int(partner[r]))}, but node {int(t.peer[r])} is blocked in round "
                      f"{current(int(t.peer[r]))}" for r in cycle)
    return _fail(f"deadlock under the blocking order: {steps}", t, cycle[0])


def _cut_points(s: Schedule, t: OpTable, send_rows: np.ndarray, recv_rows: np.ndarray) -> np.ndarray:
    """Boundaries of the elementary segments: every op's ends, the regions and output blocks, closed under the
    shift of every message whose two ends sit at different offsets (so a segment maps onto whole segments)."""
    cuts = [np.array([0, s.work_size], np.int64), t.start, t.stop]
    for r in range(s.world_size):
        for rng in (s.input_range(r), s.output_range(r)):
            if rng is not None:
                cuts.append(np.asarray(rng, np.int64))
        out = s.output_range(r)
        if out is not None:
            cuts.append(np.array([out[0] + b.offset for b in s.output_blocks(r)], np.int64))
    pts = np.unique(np.concatenate(cuts))
    a, c = t.start[send_rows], t.start[recv_rows]
    n = t.stop[send_rows] - a
    moving = (a != c) & (n > 0)
    shifts = np.unique(np.stack([a[moving], c[moving], n[moving]], axis=1), axis=0) if moving.any() else []
    while len(shifts):
        found = []
        for a0, c0, n0 in shifts.tolist():
            for x, y in ((a0, c0), (c0, a0)):  # points inside one end, moved to the other
                inner = pts[np.searchsorted(pts, x, "right"):np.searchsorted(pts, x + n0, "left")]
                found.append(inner - x + y)
        grown = np.union1d(pts, np.concatenate(found))
        if grown.size == pts.size:
            break
        pts = grown
    return pts


class _Symbolic:
    """Per (node, segment): a bitset of contributing ranks (bit p marks undefined data) and the index of the
    input element the segment's first element stands for (-1: undefined)."""

    def __init__(self, s: Schedule, t: OpTable, bounds: np.ndarray) -> None:
        p = s.world_size
        self.p = p
        self.undef_word, self.undef_bit = divmod(p, 64)
        self.words = p // 64 + 1
        self.bounds = bounds
        self.nseg = max(int(self.bounds.size) - 1, 0)
        need = s.num_nodes * self.nseg * (self.words + 2) * 8
        if need > _MEMORY_LIMIT:
            raise ValueError(f"verifying this schedule needs {need / 2**30:.1f} GiB of symbolic state; "
                             "verify a smaller world size or count")
        self.state = np.zeros((s.num_nodes, self.nseg, self.words), dtype=np.uint64)
        self.index = np.full((s.num_nodes, self.nseg), -1, dtype=np.int64)
        self.writer = np.full((s.num_nodes, self.nseg), -1, dtype=np.int64)  # row of the last op that wrote
        self.state[:, :, self.undef_word] = np.uint64(1 << self.undef_bit)
        for r in range(p):
            rng = s.input_range(r)
            if rng is not None and rng[1] > rng[0]:
                a, b = self.segments(np.array([rng[0]]), np.array([rng[1]]))
                self.state[r, a[0]:b[0], :] = self.ranks_bits([r])
                self.index[r, a[0]:b[0]] = self.bounds[a[0]:b[0]] - rng[0]

    def ranks_bits(self, ranks) -> np.ndarray:
        bits = np.zeros(self.words, dtype=np.uint64)
        for r in ranks:
            bits[r // 64] |= np.uint64(1 << (r % 64))
        return bits

    def all_ranks_bits(self) -> np.ndarray:
        bits = np.zeros(self.words, dtype=np.uint64)
        full, rest = divmod(self.p, 64)
        bits[:full] = np.uint64(0xFFFFFFFFFFFFFFFF)
        if rest:
            bits[full] = np.uint64((1 << rest) - 1)
        return bits

    def segments(self, start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.searchsorted(self.bounds, start), np.searchsorted(self.bounds, stop)

    def ranks_of(self, bits: np.ndarray) -> list[int]:
        return [w * 64 + b for w in range(self.words) for b in range(64)
                if int(bits[w]) >> b & 1 and w * 64 + b < self.p]

    def describe(self, bits: np.ndarray) -> str:
        undef = bool(int(bits[self.undef_word]) >> self.undef_bit & 1)
        return _ranks_text(self.ranks_of(bits)) + (" + undefined data" if undef else "")

    def holding(self, bits: np.ndarray, index: int, length: int) -> str:
        """What a segment holds, in words: whose input, which elements."""
        ranks = self.ranks_of(bits)
        undef = bool(int(bits[self.undef_word]) >> self.undef_bit & 1)
        if not ranks:
            return "undefined data" if undef else "nothing"
        elems = f"input elements [{index}, {index + length})"
        text = (f"rank {ranks[0]}'s {elems}" if len(ranks) == 1 else
                f"the reduction over {_ranks_text(ranks)} of {elems}")
        return text + (" + undefined data" if undef else "")


def _ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "no rank"
    if len(ranks) > 12:
        return f"{len(ranks)} ranks ({', '.join(map(str, ranks[:6]))}, ...)"
    return "ranks {" + ", ".join(map(str, ranks)) + "}"


def _popcount(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x).sum(axis=-1, dtype=np.int64)


def _execute(s: Schedule, t: OpTable, send_rows: np.ndarray, recv_rows: np.ndarray) -> _Symbolic:
    sym = _Symbolic(s, t, _cut_points(s, t, send_rows, recv_rows))
    undef_mask = np.zeros(sym.words, dtype=np.uint64)
    undef_mask[sym.undef_word] = np.uint64(1 << sym.undef_bit)
    contrib_mask = ~undef_mask
    seg_a, seg_b = sym.segments(t.start, t.stop)
    # process receive rows grouped by round; recv_rows[i] is matched with send_rows[i]
    order = np.argsort(t.round[recv_rows], kind="stable")
    recv_sorted, send_sorted = recv_rows[order], send_rows[order]
    rounds = t.round[recv_sorted]
    cuts = np.flatnonzero(np.diff(rounds)) + 1
    for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [rounds.size])).tolist(), strict=True):
        rr, ss = recv_sorted[lo:hi], send_sorted[lo:hi]
        nseg = seg_b[rr] - seg_a[rr]
        if nseg.sum() == 0:
            continue
        keep = nseg > 0
        rr, ss, nseg = rr[keep], ss[keep], nseg[keep]
        # expand each message into its segments; the sender's segment sits at the same offset into its range
        rep = np.repeat(np.arange(rr.size), nseg)
        offs = np.arange(rep.size) - np.repeat(np.cumsum(nseg) - nseg, nseg)
        seg = seg_a[rr][rep] + offs
        src_seg = np.searchsorted(sym.bounds, sym.bounds[seg] - t.start[rr][rep] + t.start[ss][rep])
        dst = t.node[rr][rep]
        src = t.node[ss][rep]
        payload = sym.state[src, src_seg]  # read before any write of this round
        pindex = sym.index[src, src_seg]
        is_reduce = t.kind[rr][rep] == OpKind.RECV_REDUCE
        row = rr[rep]
        # group writes to the same (dst, segment) in program order (row order is program order per node)
        g = np.lexsort((row, seg, dst))
        dst, seg, payload, pindex, is_reduce, row = dst[g], seg[g], payload[g], pindex[g], is_reduce[g], row[g]
        first = np.ones(dst.size, dtype=bool)
        first[1:] = (dst[1:] != dst[:-1]) | (seg[1:] != seg[:-1])
        late_store = ~is_reduce & ~first
        if late_store.any():
            r = int(row[np.flatnonzero(late_store)[0]])
            raise _fail("stores into elements that another receive of the same round already writes", t, r)
        starts = np.flatnonzero(first)
        base_is_state = is_reduce[starts]
        base = np.where(base_is_state[:, None], sym.state[dst[starts], seg[starts]], 0).astype(np.uint64)
        group_of = np.cumsum(first) - 1
        payload_undef = (payload & undef_mask).any(axis=1)
        bad = np.flatnonzero(is_reduce & payload_undef)
        if bad.size:
            r = int(row[bad[0]])
            raise _fail(f"reduces data that node {int(t.peer[r])} never defined (undefined data is sent)", t, r)
        base_undef = (base & undef_mask).any(axis=1) & base_is_state
        if base_undef.any():
            gi = int(np.flatnonzero(base_undef)[0])
            r = int(row[starts[gi]])
            raise _fail("reduces into local elements that were never defined", t, r)
        # provenance: every operand of a reduction stands for the same input element
        ref = np.where(base_is_state, sym.index[dst[starts], seg[starts]], pindex[starts])
        wrong = pindex != ref[group_of]
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            gi = int(group_of[i])
            r = int(row[i])
            length = int(sym.bounds[seg[i] + 1] - sym.bounds[seg[i]])
            into = sym.holding(base[gi] if base_is_state[gi] else payload[starts[gi]], int(ref[gi]), length)
            raise _fail(f"reduces {sym.holding(payload[i], int(pindex[i]), length)} into {into}: a reduction must "
                        "combine the same element of every input", t, r)
        union = np.bitwise_or.reduceat(payload, starts, axis=0) | base
        counted = np.add.reduceat(_popcount(payload & contrib_mask), starts) + _popcount(base & contrib_mask)
        overlap = counted != _popcount(union & contrib_mask)
        if overlap.any():
            gi = int(np.flatnonzero(overlap)[0])
            members = np.flatnonzero(group_of == gi)
            seen = base[gi].copy()
            culprit = int(row[members[-1]])
            for mi in members:
                if (seen & payload[mi] & contrib_mask).any():
                    culprit = int(row[mi])
                    twice = seen & payload[mi] & contrib_mask
                    break
                seen |= payload[mi]
            else:  # pragma: no cover
                twice = union
            raise _fail(f"double contribution: {sym.describe(twice)} would be counted twice", t, culprit)
        sym.state[dst[starts], seg[starts]] = union
        sym.index[dst[starts], seg[starts]] = ref
        last = np.concatenate((starts[1:], [dst.size])) - 1
        sym.writer[dst[starts], seg[starts]] = row[last]
    return sym


def _check_outputs(s: Schedule, t: OpTable, sym: _Symbolic) -> None:
    """Every rank's output blocks, compared segment by segment in one pass (an allgather has p blocks per rank);
    the first wrong segment in (rank, block, segment) order is reported."""
    all_bits = sym.all_ranks_bits()
    rank, start, length, index, want_bits, out_start = [], [], [], [], [], []
    for r in range(s.world_size):
        rng = s.output_range(r)
        if rng is None:
            continue
        for block in s.output_blocks(r):
            if block.length == 0:
                continue
            rank.append(r)
            start.append(rng[0] + block.offset)
            length.append(block.length)
            index.append(block.index)
            want_bits.append(all_bits if block.ranks is None else sym.ranks_bits(block.ranks))
            out_start.append(rng[0])
    if not rank:
        return
    start_a = np.array(start, np.int64)
    a, b = sym.segments(start_a, start_a + np.array(length, np.int64))
    nseg = b - a
    blk = np.repeat(np.arange(len(rank)), nseg)
    segs = np.repeat(a - np.cumsum(nseg) + nseg, nseg) + np.arange(int(nseg.sum()))
    rows = np.array(rank, np.int64)[blk]
    want = np.stack(want_bits)[blk]
    want_index = np.array(index, np.int64)[blk] + sym.bounds[segs] - start_a[blk]
    wrong = np.flatnonzero((sym.state[rows, segs] != want).any(axis=1) | (sym.index[rows, segs] != want_index))
    if wrong.size:
        i = int(wrong[0])
        _wrong_output(s, t, sym, int(rows[i]), int(segs[i]), want[i], int(want_index[i]), out_start[int(blk[i])])


def _wrong_output(s: Schedule, t: OpTable, sym: _Symbolic, r: int, seg: int, want: np.ndarray, want_index: int,
                  out_start: int) -> None:
    e0, e1 = int(sym.bounds[seg]), int(sym.bounds[seg + 1])
    got, got_index = sym.state[r, seg], int(sym.index[r, seg])
    missing, extra = want & ~got, got & ~want
    parts = []
    if _popcount(missing[None])[0]:
        parts.append(f"misses {sym.describe(missing)}")
    if _popcount(extra[None])[0]:
        parts.append(f"also holds {sym.describe(extra)}")
    if not parts:
        parts.append(f"stands for input elements [{got_index}, {got_index + e1 - e0}) instead of "
                     f"[{want_index}, {want_index + e1 - e0})")
    writer = int(sym.writer[r, seg])
    where = (f"; last written by its op {int(t.index[writer])} in round {int(t.round[writer])}{_where(t, writer)}"
             if writer >= 0 else "; never written by the schedule")
    rel = f" (its output elements [{e0 - out_start}, {e1 - out_start}))" if out_start else ""
    raise ScheduleError(f"rank {r} ends with wrong data in elements [{e0}, {e1}) of its {s.collective} output{rel}: "
                        f"holds {sym.describe(got)}, {' and '.join(parts)}{where}; expected "
                        f"{sym.holding(want, want_index, e1 - e0)}",
                        node=r, op_index=int(t.index[writer]) if writer >= 0 else None, elements=(e0, e1))


def verify(schedule: Schedule, *, itemsize: int = 4) -> VerifyReport:
    """Prove `schedule` correct (see the module docstring); raise ScheduleError naming the first problem.

    `itemsize` is the element size in bytes used for the report's byte counts.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"verify takes a built Schedule, got {type(schedule).__name__}; build one with "
                        "collectives.algorithms.build(name, collective=..., world_size=..., count=...)")
    s = schedule
    t = expand(s)
    _check_well_formed(s, t)
    matched = pair_messages(t)
    if matched is None:
        relaxed = pair_messages(t, same_round=False)
        if relaxed is None:
            raise _unmatched_message(t)
        _check_ends(t, *relaxed)
        raise _replay_blocking_order(t, *relaxed)
    send_rows, recv_rows = matched
    _check_ends(t, send_rows, recv_rows)
    sym = _execute(s, t, send_rows, recv_rows)
    _check_outputs(s, t, sym)
    length = t.stop - t.start
    remote = t.peer != t.node
    is_send = (t.kind == OpKind.SEND) & remote
    is_recv = (t.kind != OpKind.SEND) & remote
    sent = np.bincount(t.node[is_send], weights=length[is_send], minlength=s.num_nodes) * itemsize
    received = np.bincount(t.node[is_recv], weights=length[is_recv], minlength=s.num_nodes) * itemsize
    steps = int(np.unique(t.round).size)
    local = int(((t.kind == OpKind.SEND) & ~remote).sum())
    return VerifyReport(s.algorithm, s.collective, s.world_size, s.count, s.num_nodes, steps,
                        int(is_send.sum()), itemsize, sent.astype(np.int64), received.astype(np.int64), local)


__all__ = ["ScheduleError", "VerifyReport", "verify"]
