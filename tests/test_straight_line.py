"""shm_program.StraightLine: the fixed programs `collectives calibrate` times with the plan runner's own
instructions (copies, fused reductions, and the counters a round publishes and waits on)."""

from __future__ import annotations

import numpy as np
import pytest

from collectives.transport import shm_program

pytestmark = pytest.mark.skipif(not shm_program.enabled(), reason="the C plan runner is not built")


def _kernel():
    kernel = shm_program.kernel_for(np.dtype(np.float32), "sum", 0)
    assert kernel is not None
    return kernel


def test_copies_and_reductions_run_in_order_over_the_given_ranges():
    x = np.arange(8, dtype=np.float32)
    own = np.zeros(8, np.float32)
    peer = np.full(8, 10, np.float32)
    steps = [("copy", 1, 0, 0, 4), ("reduce", 0, [0, 2], 4, 8), ("copy", 0, 2, 0, 2)]
    shm_program.StraightLine(steps, [x, own, peer], 4, _kernel())()
    assert own.tolist() == [0, 1, 2, 3, 0, 0, 0, 0]
    assert x.tolist() == [10, 10, 2, 3, 14, 15, 16, 17]


def test_publish_and_wait_count_from_the_pass_s_start():
    """A pass publishes base + k (base: the rank's counter when the pass starts) and waits for base + k: run
    twice, the counter ends at 2 x the last publish, and a wait on a rank that never publishes times out."""
    x = np.zeros(4, np.float32)
    mine, silent = np.zeros(1, np.int64), np.zeros(1, np.int64)
    line = shm_program.StraightLine([("publish", 1), ("wait", 0, 1), ("copy", 0, 0, 0, 4), ("publish", 3)],
                                    [x], 4, _kernel(), [mine, silent], 0)
    line()
    line()
    assert mine[0] == 6
    stuck = shm_program.StraightLine([("publish", 1), ("wait", 1, 1)], [x], 4, _kernel(), [mine, silent], 0)
    with pytest.raises(RuntimeError, match="rank 1 did not publish"):
        stuck(polls=8, timeout=0.05)


def test_publish_and_wait_need_counters():
    with pytest.raises(ValueError, match="publish/wait with counters"):
        shm_program.StraightLine([("wait", 0, 1)], [np.zeros(1, np.float32)], 4, _kernel())
