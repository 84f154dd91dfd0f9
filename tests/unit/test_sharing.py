"""Link sharing over time among one round's messages (collectives/simulator/sharing.py), against closed forms
of processor sharing: the event model's rule (event.py) for messages that start apart."""

from __future__ import annotations

import numpy as np
import pytest

from collectives.simulator.flows import Hops
from collectives.simulator.sharing import LinkClock, shared_flows, staggered, stream_ends

BW = 10e9  # bytes/s
W = 1e6  # bytes per message: W / BW = 100 us alone


def shared(paths: list[list[int]]):
    """SharedLinks of messages with the given link paths, one chunk each, every link at BW."""
    fidx = np.concatenate([np.full(len(p), f, np.int64) for f, p in enumerate(paths)])
    hl = np.concatenate([np.asarray(p, np.int64) for p in paths])
    units = np.ones(len(paths))
    load = np.bincount(hl, weights=units[fidx])[hl]
    return shared_flows(fidx, hl, load, np.full(hl.size, BW), units)


def test_a_link_alone_is_not_shared():
    assert shared([[0], [1], [2, 3]]) is None


@pytest.mark.parametrize("gap", [0.0, 30e-6, 100e-6, 250e-6])
def test_two_messages_on_one_link(gap):
    sh = shared([[0], [0]])
    alone = W / BW
    ends = stream_ends(sh, np.array([0.0, gap]), np.full(2, W))
    if gap >= alone:  # no overlap: each streams alone
        want = [alone, gap + alone]
    else:  # the first streams alone until the second starts, then both at half rate; the link stays busy
        want = [alone + (alone - gap), 2 * alone]
    assert ends == pytest.approx(want, rel=1e-12)
    assert staggered(sh, np.array([0.0, gap])) == (gap > 0)


def test_messages_starting_together_share_for_their_whole_duration():
    sh = shared([[0, 1], [0], [1]])  # each link carries two: every message at half rate, as the analytic rule
    ends = stream_ends(sh, np.zeros(3), np.full(3, W))
    assert ends == pytest.approx(np.full(3, 2 * W / BW), rel=1e-12)


def test_a_message_runs_at_its_slowest_links_share():
    # message 0 crosses links 0 and 1; link 1 also carries two late messages
    sh = shared([[0, 1], [1], [1]])
    alone = W / BW
    ends = stream_ends(sh, np.array([0.0, 50e-6, 50e-6]), np.full(3, W))
    # 0..50 us: message 0 alone (half done); then three on link 1 at a third each until message 0 ends
    t0 = 50e-6 + 3 * (W - 50e-6 * BW) / BW
    assert ends[0] == pytest.approx(t0, rel=1e-12)
    # the two late ones then share link 1 at half rate for what is left (the link never idles: busy period)
    assert ends[1] == pytest.approx(ends[2]) and ends[1] == pytest.approx(3 * alone, rel=1e-12)


def _hops(paths: list[list[int]]) -> Hops:
    fidx = np.concatenate([np.full(len(p), f, np.int64) for f, p in enumerate(paths)])
    hl = np.concatenate([np.asarray(p, np.int64) for p in paths])
    starts = np.flatnonzero(np.r_[True, fidx[1:] != fidx[:-1]])
    z = np.zeros(0)
    return Hops(np.zeros(len(paths), np.int64), np.ones(len(paths), np.int64), fidx, hl, z, z, z, z, starts, 0.0,
                z, z, z, None, False, False)


def test_a_later_round_yields_to_an_earlier_rounds_messages():
    clock = LinkClock()
    earlier = _hops([[3], [4]])
    clock.record(earlier, np.array([0.0, 20e-6]), np.array([100e-6, 120e-6]))
    later = _hops([[3, 5], [4], [6]])
    spans = clock.spans(later)
    # message 0 starts inside link 3's span: it waits for its end; message 1 starts before link 4's span and
    # is paused for it; message 2's link is free
    go = clock.waits(later, spans, np.array([50e-6, 10e-6, 50e-6]))
    assert go == pytest.approx([100e-6, 10e-6, 50e-6])
    end = clock.paused(later, spans, go, go + 30e-6)
    assert end == pytest.approx([130e-6, 40e-6 + 100e-6, 80e-6])
