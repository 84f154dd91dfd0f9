"""Double binary tree (NCCL's Tree algorithm): two complementary binary trees, each carrying half the data.

Vocabulary. *Tree 0* is NCCL's in-order binary tree over ranks (src/graph/trees.cc, ncclGetBtree): with
bit = the lowest set bit of rank r > 0, r's *parent* is (r ^ bit) | (bit << 1), or r ^ bit when that is out of
range (n not a power of two); rank 0 is the *root* and has one child, the largest power of two below n.
*Tree 1* mirrors tree 0 (r -> n-1-r) when n is even and shifts it by one rank (r -> r+1 mod n) when n is odd, so
almost every rank is a leaf in one tree and interior in the other, and both trees together use each rank's
links about equally. Tree 0 carries *block* 0 of the buffer, tree 1 block 1.

Allreduce = reduce up both trees to their roots, then broadcast back down, pipelined over `chunks` *segments*
per block: a node of *height* h (longest path down to a leaf) sends segment t - h to its parent in round t, so a
segment reaches a parent from every child (all of height < h) in strictly earlier rounds than the parent passes
it on. The root of height H holds segment s fully reduced after round s + H - 1; the down pass sends segment
t - H - d from a node at *depth* d to its children in round t, so a node receives segment s in round
s + H + d - 1 and forwards it in the next. Both trees run side by side in the same rounds: one phase, one
round pattern of 2·chunks + ... rounds in total: chunks + 2H - 1 with H the taller tree's height.

The per-rank parent, children, heights and depths are numpy arrays of length n, built once (O(n lg n)); the
round pattern indexes them with the member number, so one rank's program costs only its own operations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send

from ._pipeline import Lane, lane, memo, pipelined_phase
from .chain import pipeline_rounds


def btree_parents(n: int) -> np.ndarray:
    """Parent of every rank in NCCL's in-order binary tree rooted at 0 (-1 for the root), vectorized."""
    r = np.arange(n, dtype=np.int64)
    bit = r & -r  # lowest set bit (0 for rank 0)
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= n, r ^ bit, up)  # clipped at the end of the range, as ncclGetBtree does
    up[0] = -1
    return up


@dataclass(frozen=True)
class Tree:
    """One tree as per-node arrays: parent (-1 at the root), children (-1 where absent, increasing), height,
    depth."""

    parent: np.ndarray
    children: np.ndarray  # (n, 2), or (n, 3) for NCCL's trees (a domain head: its chain and two domains)
    height: np.ndarray
    depth: np.ndarray

    @classmethod
    def from_parents(cls, parent: np.ndarray, max_children: int = 2) -> Tree:
        n = parent.size
        nodes = np.arange(n, dtype=np.int64)
        has_parent = parent >= 0
        assert int((~has_parent).sum()) == (1 if n else 0), "a tree has exactly one root"
        kids, owners = nodes[has_parent], parent[has_parent]
        nkids = np.bincount(owners, minlength=n)
        assert not (nkids > max_children).any(), f"at most {max_children} children per node"
        # a node's children in increasing order: kids are increasing, so a stable sort by owner keeps them so
        # (np.lexsort((kids, owners))'s order), and an owner's first child sits where its run starts
        order = np.argsort(owners, kind="stable")
        kids, owners = kids[order], owners[order]
        first = (np.cumsum(nkids) - nkids)[owners]
        children = np.full((n, max_children), -1, dtype=np.int64)
        children[owners, np.arange(kids.size) - first] = kids
        # the levels top-down from the root (each the children of the one above): depth, and the order in which
        # heights are computed, in O(n)
        depth = np.zeros(n, dtype=np.int64)
        levels = []
        frontier = nodes[~has_parent]
        while frontier.size:
            depth[frontier] = len(levels)
            levels.append(frontier)
            below = children[frontier].ravel()
            frontier = below[below >= 0]
        assert sum(level.size for level in levels) == n, "every node hangs from the root"
        # height: the levels bottom-up (children before parents), each node the max over its children
        height = np.zeros(n, dtype=np.int64)
        for at in reversed(levels[:-1]):
            ch = children[at]
            top = np.zeros(at.size, dtype=np.int64)
            for j in range(max_children):  # column by column: numpy's max over a short last axis is slow
                c = ch[:, j]
                top = np.maximum(top, np.where(c >= 0, height[np.maximum(c, 0)] + 1, 0))
            height[at] = top
        # the invariant the pipeline timing relies on: a child is strictly lower than its parent
        assert (height[kids] < height[owners]).all()
        return cls(parent, children, height, depth)


def double_binary_tree(n: int) -> tuple[Tree, Tree]:
    """NCCL's two trees over n ranks (ncclGetDtree): tree 1 mirrors tree 0 for even n, shifts it for odd n."""
    p0 = btree_parents(n)
    r = np.arange(n, dtype=np.int64)
    if n % 2:
        src = p0[(r - 1) % n]  # rank r plays rank r-1's part in tree 0
        p1 = np.where(src < 0, -1, (src + 1) % n)
    else:
        src = p0[n - 1 - r]
        p1 = np.where(src < 0, -1, n - 1 - src)
    return Tree.from_parents(p0), Tree.from_parents(p1)


def dbt_rounds(trees: tuple[Tree, Tree], chunks: int) -> list[Round]:
    """Round t: reduce segment t - height up, broadcast segment t - H - depth down, in each tree at once."""
    heights = [int(tr.height.max(initial=0)) for tr in trees]
    n = int(trees[0].parent.size)

    def active(b, peer, seg):
        """(peer, chunk id) of segment `seg` of block b; idle where there is no peer or no such segment."""
        return np.where((peer >= 0) & (seg >= 0) & (seg < chunks), peer, -1), b * chunks + np.minimum(np.maximum(seg, 0), chunks - 1)

    def lanes():
        """Per lane (in slot order): (block, kind, peer of every member, key): member m works on segment
        t - key[m] in round t, where it has a peer."""
        out = []
        for b, (tr, H) in enumerate(zip(trees, heights, strict=True)):
            for j in range(2):
                child = tr.children[:, j]
                out.append((b, recv_reduce, child, tr.height[np.maximum(child, 0)]))
            out.append((b, send, tr.parent, tr.height))
            out.append((b, recv, tr.parent, H + tr.depth - 1))
            for j in range(2):
                out.append((b, send, tr.children[:, j], H + tr.depth))
        return out

    index: list = []

    def by_key():
        """Per lane: members with a peer sorted by key (stable) and where each key starts, so the members busy
        in round t (key in (t - chunks, t]) are one slice: a whole round costs its own messages, not n."""
        if not index:
            for b, kind, peer, key in lanes():
                mem = np.flatnonzero(peer >= 0)
                k = key[mem]
                order = np.argsort(k, kind="stable")
                mem, k = mem[order], k[order]
                top = int(k.max(initial=-1))
                starts = np.searchsorted(k, np.arange(top + 2))
                index.append((b, kind, peer, key, mem, starts, top))
        return index

    def slots(m, t):
        if np.ndim(m) == 1 and np.ndim(t) == 0 and np.size(m) == n and n and m[0] == 0 and m[-1] == n - 1 \
                and (n == 1 or bool(np.all(np.diff(m) == 1))):
            return every_member(int(t))
        out = []
        # tree 0's slots come before tree 1's on every node, so two messages between the same pair of
        # nodes in one round (one per tree) are matched in the same program order at both ends
        for b, (tr, H) in enumerate(zip(trees, heights, strict=True)):
            parent = tr.parent[m]
            for j in range(2):  # up: children's segments arrive in their own sending rounds
                child = tr.children[m, j]
                out.append(recv_reduce(*active(b, child, t - tr.height[np.maximum(child, 0)])))
            out.append(send(*active(b, parent, t - tr.height[m])))
            # down: from the parent in its sending round, to the children one round later
            out.append(recv(*active(b, parent, t - H - tr.depth[m] + 1)))
            for j in range(2):
                out.append(send(*active(b, tr.children[m, j], t - H - tr.depth[m])))
        return out

    def every_member(t: int):
        """slots(np.arange(n), t), built from the busy members only (the analytic simulator's call)."""
        out = []
        for b, kind, peer, key, mem, starts, top in by_key():
            lo, hi = max(t - chunks + 1, 0), min(t, top)
            busy = mem[starts[lo]:starts[hi + 1]] if lo <= hi else mem[:0]
            if busy.size == 0:
                out.append(kind(-1, 0))
                continue
            pf = np.full(n, -1, np.int64)
            pf[busy] = peer[busy]
            cf = np.zeros(n, np.int64)
            cf[busy] = b * chunks + (t - key[busy])
            out.append(kind(pf, cf))
        return out

    # lags run from 0 (leaves sending up) to 2H - 1 (the deepest parents sending down)
    return pipeline_rounds(slots, 2 * max(heights), chunks, "double binary tree")


def _replicas(tree: Tree, members) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(members as (R, n), then per lane position: its replica, its tree node and its member). Positions run
    node by node where that lists the members in increasing order (a tree over domains replicated on each GPU
    of a domain: the order a lane keeps, so it need not sort them), else replica by replica."""
    members = np.atleast_2d(np.asarray(members, np.int64))
    R, n = members.shape
    by_node = members.T.ravel()
    if by_node.size < 2 or bool((by_node[1:] > by_node[:-1]).all()):
        return members, np.tile(np.arange(R, dtype=np.int64), n), np.repeat(np.arange(n, dtype=np.int64), R), by_node
    return members, np.repeat(np.arange(R, dtype=np.int64), n), np.tile(np.arange(n, dtype=np.int64), R), \
        members.ravel()


def _numbered_replicas(members) -> int | None:
    """R where members[r, node] = node R + r for every replica r < R and node (the members number the positions
    node by node, from 0: NCCL's trees over all ranks, R = 1, and a tree over domains on each GPU of a domain,
    R = G, without a placement), else None. Strictly increasing integers from 0 to R n - 1 are that range, so
    the first and last positions and one pass over the order tell it."""
    members = np.atleast_2d(np.asarray(members, np.int64))
    by_node = members.T.ravel()
    if not by_node.size or int(by_node[0]) != 0 or int(by_node[-1]) != by_node.size - 1:
        return None
    if by_node.size > 1 and not bool((by_node[1:] > by_node[:-1]).all()):
        return None
    return int(members.shape[0])


def _peer_lane(kind, members: np.ndarray, rep: np.ndarray, me: np.ndarray, peer: np.ndarray, lags, data) -> Lane:
    """lane(kind, me, the member playing tree node peer[i] in replica rep[i], lags, data's chunks) over the
    positions with a peer (peer >= 0) only, taken out before the members are mapped: the lane lane() makes
    of every position (the same members, peers, lags and chunk ranges), at the cost of the positions kept.
    `lags(at)` gives the kept positions' lags."""
    at = np.flatnonzero(peer >= 0)
    x = peer[at]
    if members.shape[0] == 1:  # one replica (NCCL's trees over all ranks): its one row of members
        r, mapped = np.zeros(at.size, np.int64), members[0][x]
    else:
        r = rep[at]
        mapped = members[r, x]
    return lane(kind, me[at], mapped, lags(at), lambda k, pos: data(k, r[pos]))


def _positions(tree: Tree, members):
    """_replicas(tree, members) and the tree's per-node arrays at each lane position (`of`: a per-node array at
    the positions); one replica's positions are the tree's nodes in order, whose arrays are read as they are."""
    members, rep, node, me = _replicas(tree, members)
    of = (lambda a: a) if members.shape[0] == 1 else (lambda a: a[node])  # noqa: E731
    return members, rep, me, of


class _TreePeers:
    """Per link of a tree (its parent, or its j-th child), on members numbered node by node with R replicas
    (_numbered_replicas): the nodes that have that peer (increasing) and the peers, and the lane's members and
    peer members (node x's in replica r: x R + r, and its peer's), each found once and shared by the lanes up
    and down the tree that use that link."""

    def __init__(self, tree: Tree, R: int) -> None:
        self.tree = tree
        self.R = R
        self._kept: dict = {}

    def of(self, link) -> tuple[np.ndarray, np.ndarray]:
        """("parent" or a child column j): (nodes with that peer, their peers)."""
        if link not in self._kept:
            peer = self.tree.parent if link == "parent" else self.tree.children[:, link]
            nodes = np.flatnonzero(peer >= 0)
            self._kept[link] = (nodes, peer[nodes])
        return self._kept[link]

    def members(self, link) -> tuple[np.ndarray, np.ndarray]:
        """(members, peer members) of the lane over `link`: each node's R replicas in turn."""
        key = ("members", link)
        if key not in self._kept:
            nodes, peers = self.of(link)
            if self.R > 1:
                step = np.arange(self.R, dtype=np.int64)
                nodes, peers = (nodes[:, None] * self.R + step).ravel(), (peers[:, None] * self.R + step).ravel()
            self._kept[key] = (nodes, peers)
        return self._kept[key]


def _plus(x: np.ndarray, c: int) -> np.ndarray:
    """x + c, written into x (a fresh array of the caller's)."""
    x += c
    return x


def _numbered_lane(kind, kept: _TreePeers, link, lags: np.ndarray, data) -> Lane:
    """The lane _peer_lane makes over `link` of a tree whose members are numbered node by node (`kept`:
    _numbered_replicas), with lags `lags` per node with that peer: the positions with a peer are those of the
    nodes kept, each node's R replicas in turn, so the lane is written down from the nodes (node x's member
    and peer in replica r: x R + r and peer R + r; its lag in every replica), its members increasing and every
    one with a peer (as lane() keeps such a lane), and position pos is replica pos mod R."""
    R = kept.R
    members, peers = kept.members(link)
    # (pos mod R as pos - (pos // R) R: numpy divides by a constant faster than it takes the remainder)
    return Lane(kind, members, peers, np.repeat(lags, R) if R > 1 else lags,
                lambda k, pos: data(k, pos - (pos // R) * R))


def _up_lanes(tree: Tree, kept: _TreePeers, data, lag: int) -> list[Lane]:
    """tree_up_lanes on members numbered node by node (_numbered_replicas)."""
    lanes = []
    for j in range(tree.children.shape[1]):  # each child's copy in the round it sends it
        child = kept.of(j)[1]
        lanes.append(_numbered_lane(recv_reduce, kept, j, _plus(tree.height[child], lag), data))
    nodes = kept.of("parent")[0]
    lanes.append(_numbered_lane(send, kept, "parent", _plus(tree.height[nodes], lag), data))
    return lanes


def _down_lanes(tree: Tree, kept: _TreePeers, data, start: int) -> list[Lane]:
    """tree_down_lanes on members numbered node by node (_numbered_replicas)."""
    nodes = kept.of("parent")[0]
    lanes = [_numbered_lane(recv, kept, "parent", _plus(tree.depth[nodes], start - 1), data)]
    for j in range(tree.children.shape[1]):
        nodes = kept.of(j)[0]
        lanes.append(_numbered_lane(send, kept, j, _plus(tree.depth[nodes], start), data))
    return lanes


def tree_up_lanes(tree: Tree, members, data, lag: int = 0) -> list[Lane]:
    """The reduction up `tree`, replicated: `members[r, node]` plays tree node `node` in replica r, `data(k, r)`
    is the chunk range replica r moves for piece k. A node of height h sends piece k to its parent in round
    k + lag + h; the parent reduce-receives it in that round (its children are all lower), so the root holds
    piece k reduced after round k + lag + H - 1."""
    R = _numbered_replicas(members)
    if R is not None:
        return _up_lanes(tree, _TreePeers(tree, R), data, lag)
    members, rep, me, of = _positions(tree, members)
    height, children = of(tree.height), of(tree.children)
    lanes = []
    for j in range(children.shape[1]):  # each child's copy in the round it sends it
        child = children[:, j]
        lanes.append(_peer_lane(recv_reduce, members, rep, me, child,
                                lambda at, child=child: lag + tree.height[child[at]], data))
    lanes.append(_peer_lane(send, members, rep, me, of(tree.parent), lambda at: lag + height[at], data))
    return lanes


def tree_down_lanes(tree: Tree, members, data, start: int) -> list[Lane]:
    """The broadcast down `tree` from its root, replicated as in tree_up_lanes: a node of depth d receives
    piece k from its parent in round k + start + d - 1 and sends it to its children in the next."""
    R = _numbered_replicas(members)
    if R is not None:
        return _down_lanes(tree, _TreePeers(tree, R), data, start)
    members, rep, me, of = _positions(tree, members)
    depth, children = of(tree.depth), of(tree.children)
    lanes = [_peer_lane(recv, members, rep, me, of(tree.parent), lambda at: start + depth[at] - 1, data)]
    for j in range(children.shape[1]):
        lanes.append(_peer_lane(send, members, rep, me, children[:, j], lambda at: start + depth[at], data))
    return lanes


def tree_lanes(tree: Tree, members, data, lag: int = 0, height: int | None = None) -> list[Lane]:
    """One tree's allreduce as pipelined lanes: up (tree_up_lanes) then down from the root once it holds the
    piece (tree_down_lanes at lag + H; H: `height`, default the tree's own, so trees sharing rounds can share
    one H). On members numbered node by node the lanes up and down a link share its nodes and peers."""
    H = int(tree.height.max(initial=0)) if height is None else int(height)
    R = _numbered_replicas(members)
    if R is not None:
        kept = _TreePeers(tree, R)
        return _up_lanes(tree, kept, data, lag) + _down_lanes(tree, kept, data, lag + H)
    return tree_up_lanes(tree, members, data, lag) + tree_down_lanes(tree, members, data, lag + H)


def nccl_trees(topology, channels: int) -> list[Tree]:
    """NCCL's tree of each channel over all ranks of a cluster (src/graph/trees.cc, connect.cc; on one domain,
    the chain alone):
    across domains channel c uses tree c % 2 of the double binary tree over the domains; inside a domain the
    GPUs form a chain whose head, GPU h = (c // 2) mod G, links the domain to its parent and child domains'
    heads (the same local index, so one NIC rail per channel pair). A head has up to three children: the next
    GPU of its chain and two domains' heads."""
    G, D = topology.gpus_per_domain, topology.num_domains
    domain_trees = double_binary_tree(D)
    if getattr(topology, "placed", False):
        return _placed_nccl_trees(topology, channels, domain_trees)

    def channel_tree(c: int) -> Tree:
        return chain_tree(domain_trees[c % 2], G, (c // 2) % G)

    # a channel's tree depends on its domain tree and head only: the builds of several channel counts (NCCL's
    # fewer channels for small calls) share them
    known = _CHANNEL_TREES.get(id(topology))
    if known is None or known[0] is not topology:
        if len(_CHANNEL_TREES) >= 4:
            _CHANNEL_TREES.pop(next(iter(_CHANNEL_TREES)))
        known = _CHANNEL_TREES[id(topology)] = (topology, {})
    trees = known[1]
    out = []
    for c in range(channels):
        key = (c % 2, (c // 2) % G)
        if key not in trees:
            trees[key] = channel_tree(c)
        out.append(trees[key])
    return out


_CHANNEL_TREES: dict[int, tuple] = {}  # per topology (a few): NCCL's tree of each (domain tree, head)


def chain_tree(domain_tree: Tree, G: int, h: int) -> Tree:
    """NCCL's tree of one channel over D domains of G GPUs (rank d G + j is GPU j of domain d): in each domain
    a chain from its head, GPU h, through GPUs h + 1, h + 2, ... (mod G), and the heads linked as `domain_tree`
    links the domains. Tree.from_parents of its parents, the same arrays, written down from that shape rather
    than found level by level: a GPU at chain position q > 0 (q = (j - h) mod G) of domain d has depth
    depth_d + q, height G - 1 - q and the next GPU of the chain as its one child (none at q = G - 1); a head has
    depth depth_d, height G - 1 + height_d, and as children the next GPU of its chain (G > 1) and the heads of
    the domain's children, in increasing order."""
    D = int(domain_tree.parent.size)
    cols = np.arange(G, dtype=np.int64)
    q = (cols - h) % G  # each GPU's position in its domain's chain, head first
    base = np.arange(D, dtype=np.int64)[:, None] * G  # (D, G) arrays below: rank d G + j at [d, j]
    up = domain_tree.parent
    parent = base + (cols - 1) % G
    parent[:, h] = np.where(up >= 0, up * G + h, -1)
    depth = domain_tree.depth[:, None] + q
    height = np.repeat((G - 1 - q)[None, :], D, axis=0)
    height[:, h] = G - 1 + domain_tree.height
    children = np.full((D, G, 3), -1, dtype=np.int64)
    chain = np.flatnonzero((q > 0) & (q < G - 1))
    children[:, chain, 0] = base + (chain + 1) % G
    heads = base[:, 0] + h
    below = np.where(domain_tree.children >= 0, domain_tree.children * G + h, -1)  # (D, 2) child heads
    nxt = heads - h + (h + 1) % G if G > 1 else np.full(D, -1, np.int64)  # the head's chain successor
    cand = np.concatenate([nxt[:, None], below], axis=1)
    # increasing, absent children (-1) last
    big = np.iinfo(np.int64).max
    cand = np.sort(np.where(cand >= 0, cand, big), axis=1)
    children[:, h] = np.where(cand == big, -1, cand)
    parent, children, height, depth = parent.ravel(), children.reshape(D * G, 3), height.ravel(), depth.ravel()
    return Tree(parent, children, height, depth)


def _placed_nccl_trees(topology, channels: int, domain_trees: list[Tree]) -> list[Tree]:
    """nccl_trees on a cluster with a placement: domain d's chain over its n_d ranks in local slot order, headed
    by its GPU of local index (c // 2) mod n_d."""
    dom = topology.domain_groups()
    D, G = dom.shape
    n = (dom >= 0).sum(axis=1)
    d, j = np.nonzero(dom >= 0)
    rank = dom[d, j]
    out = []
    for c in range(channels):
        tr = domain_trees[c % 2]
        heads = dom[np.arange(D), (c // 2) % n]
        q = (j - (c // 2) % n[d]) % n[d]
        up = tr.parent[d]
        parent = np.where(q > 0, dom[d, (j - 1) % n[d]], np.where(up >= 0, heads[np.maximum(up, 0)], -1))
        by_rank = np.empty(rank.size, np.int64)
        by_rank[rank] = parent
        out.append(Tree.from_parents(by_rank, max_children=3))
    return out


def _itemsize(dtype) -> int:
    return 2 if str(dtype).lower() == "bfloat16" else int(np.dtype(dtype).itemsize)


def default_channels(topology) -> int:
    """NCCL's tree channels on a runtime cluster (one pair per NIC across domains; at least one pair, fewer than
    NCCL's where ring.CHANNEL_LANE_BUDGET bounds them), else the two trees."""
    from .ring import CHANNEL_LANE_BUDGET

    rt = getattr(topology, "runtime", None)
    if rt is None:
        return 2
    return max(2, min(rt.channels("tree"), CHANNEL_LANE_BUDGET // max(topology.world_size, 1)))


@register("double_binary_tree", ("allreduce",),
          summary="NCCL's tree: two complementary binary trees each carrying half the data (on NCCL's runtime "
                  "or across domains: chains inside a domain, trees over the domains, one channel pair per NIC), "
                  "pipelined over `chunks`")
def build_double_binary_tree(collective: str, world_size: int, count: int, *, root=None, topology=None,
                             chunks: int | None = None, channels: int | None = None, protocol: str = "Simple",
                             dtype="float32") -> Schedule:
    p = world_size
    if collective != "allreduce":
        raise ValueError(f"double_binary_tree implements allreduce only, not {collective}")
    domains = getattr(topology, "num_domains", 1) if topology is not None else 1
    # NCCL's shape wherever NCCL runs (and across domains anywhere): chains inside a domain, the double binary
    # tree over the domains. Inside a node NCCL links a tree channel's GPUs as a chain in the tree graph's order
    # (src/graph/connect.cc, ncclTopoPreset: tree.up = treeIntra[i - 1], tree.down[0] = treeIntra[i + 1]) and
    # builds binary trees across nodes only (connectTrees), so on one domain its tree is a chain of the
    # domain's GPUs. Hosts (no runtime) keep the binary trees over the ranks.
    nccl = getattr(topology, "world_size", None) == p and \
        (domains > 1 or getattr(topology, "runtime", None) is not None)
    C = (default_channels(topology) if nccl else 2) if channels is None else \
        check_chunks("double_binary_tree", channels, "channels")
    if chunks is None:
        rt = getattr(topology, "runtime", None)
        c = 1 if rt is None else rt.pieces("tree", protocol, count * _itemsize(dtype), C)
    else:
        c = check_chunks("double_binary_tree", chunks)
    ranks = np.arange(p, dtype=np.int64)
    params = {"chunks": c, "channels": C, "latency_class": "tree"}
    if not nccl:
        if C != 2:
            raise ValueError(f"double_binary_tree over one domain without a runtime runs its two trees (channels=2), "
                             f"got channels={C}")
        # block b (one half of the buffer) belongs to tree b; chunk id = b * chunks + segment
        phase = Phase("double binary tree", ranks[None, :], ChunkTable.whole(count, 2, c),
                      dbt_rounds(double_binary_tree(p), c))
        return Schedule("double_binary_tree", collective, p, count, [phase], params=params, topology=topology)
    # channel t carries part t of every piece: chunk id = piece * channels + t (piece-major)

    def stages():  # independent of the size: kept across a sweep's sizes
        lanes = []
        placed = getattr(topology, "placed", False)
        laid = memo(topology, ("nccl tree lanes",), dict)  # per (domain tree, head), as nccl_trees keeps trees
        for t, tree in enumerate(nccl_trees(topology, C)):
            if placed:
                lanes += tree_lanes(tree, ranks[None, :], lambda k, r, t=t: (k * C + t, 1))
                continue
            # channel t moves part t of every piece, chunk k * C + t, whoever the member: the lanes of its tree
            # are laid out once (the builds of several channel counts share them) and take this count's chunks
            key = (t % 2, (t // 2) % topology.gpus_per_domain)
            if key not in laid:
                laid[key] = tree_lanes(tree, ranks[None, :], lambda k, r: (k, 1))
            lanes += [replace(ln, chunks=lambda k, at, t=t: (k * C + t, 1)) for ln in laid[key]]
        return lanes

    lanes = memo(topology, ("nccl_tree", C), stages)
    # one member array for the cluster: the builds of a sweep's sizes share their phases' groups
    ranks = memo(topology, ("ranks", p), lambda: np.arange(p, dtype=np.int64))
    phase = pipelined_phase("NCCL tree (chains in domains, double binary tree across)", ranks,
                            ChunkTable.whole(count, c, C), lanes, c, piece_invariant=True)
    return Schedule("double_binary_tree", collective, p, count, [phase], params=params, topology=topology)
