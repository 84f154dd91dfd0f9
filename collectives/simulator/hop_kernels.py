"""Compiled passes over a round's hops for the analytic simulator (flows.py): the attributes of each hop's
link, each path's latency, and the links' loads, in one or two passes over the hops instead of numpy's dozen.

A huge round (a pipeline's stages at 331,776 GPUs) has millions of hops; numpy's version (flows._paths,
flows.flow_hops) reads and writes the hop arrays once per operation. These kernels compute the same arrays
with the same floating-point operations in the same order (a sum over a flow's hops or a link's hops adds them
in hop order, as np.bincount does), so their results are identical; tests/unit/test_simulator_fast_paths.py
checks them against the numpy forms.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def path_attributes(fidx, hl, block_start, block_bw, block_lat, block_tier, nflows):
    """(bandwidth, latency and tier of each hop's link, each flow's path latency, the first hop of each flow
    with hops) of flow-major hops (fidx, hl), on links whose attributes are constant over blocks of ids
    (block b: ids from block_start[b]); what link_attributes, np.bincount(fidx, weights=latency) and the
    flow boundaries give."""
    H = hl.size
    nb = block_start.size
    raw_bw = np.empty(H)
    hop_lat = np.empty(H)
    hop_tier = np.empty(H, np.int64)
    lat = np.zeros(nflows)
    first = np.zeros(H, np.bool_)
    for i in range(H):
        x = hl[i]
        b = nb - 1
        while b > 0 and block_start[b] > x:  # the last block starting at or below x (searchsorted's)
            b -= 1
        raw_bw[i] = block_bw[b]
        hop_lat[i] = block_lat[b]
        hop_tier[i] = block_tier[b]
        lat[fidx[i]] += hop_lat[i]
        first[i] = i == 0 or fidx[i] != fidx[i - 1]
    return raw_bw, hop_lat, hop_tier, lat, np.flatnonzero(first)


@numba.njit(cache=True)
def link_loads(fidx, hl, units, raw_bw, hop_tier, num_links, ntiers, nic_tier, nflows):
    """(chunks on each hop's link, max over hops of chunks / raw bandwidth, chunk-hops per tier, whether each
    flow crosses a NIC) of flow-major hops carrying units[fidx] chunks: np.bincount(hl, weights=units[fidx],
    minlength=num_links)[hl], its ratio's maximum, np.bincount(hop_tier, weights=units[fidx])[:ntiers] and the
    flows with a hop of tier nic_tier."""
    H = hl.size
    load = np.zeros(num_links)
    for i in range(H):
        load[hl[i]] += units[fidx[i]]
    hop_load = np.empty(H)
    tier = np.zeros(ntiers)
    net = np.zeros(nflows, np.bool_)
    best = -np.inf
    for i in range(H):
        v = load[hl[i]]
        hop_load[i] = v
        r = v / raw_bw[i]
        if r > best or r != r:  # numpy's maximum propagates nan
            best = r if best == best else best
        t = hop_tier[i]
        if t < ntiers:
            tier[t] += units[fidx[i]]
        if t == nic_tier:
            net[fidx[i]] = True
    return hop_load, best, tier, net


__all__ = ["link_loads", "path_attributes"]
