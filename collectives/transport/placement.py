"""Placement: which MPI process runs each node of a schedule, and the tag slots that keep their messages apart.

Ranks 0..p-1 of a schedule always run on the communicator's ranks 0..p-1. Switch nodes (node >= world_size,
in-network reduction) run either on the ranks themselves (*leader emulation*: switch node s on rank s % p) or
on switch daemons started with MPMD `mpiexec ... : -n D python -m collectives.switchd` (switch node s on
daemon (s - p) % D).

A process may host several nodes, so a message's tag carries the sender's and receiver's *slot* (the node's
index among the nodes its process hosts): between two processes, messages of one (sender node, receiver node)
pair are matched in posting order, which both ends share, while different pairs never meet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Node -> process rank in `procs` order, for a schedule of `num_nodes` nodes over `world_size` ranks."""

    world_size: int
    num_nodes: int
    rank_procs: tuple[int, ...]  # proc (rank of the carrying communicator) of schedule rank r
    switch_procs: tuple[int, ...]  # procs that host switch nodes, round-robin

    @property
    def mode(self) -> str:
        if self.num_nodes == self.world_size:
            return "ranks"
        return "leader" if self.switch_procs == self.rank_procs else "daemons"

    @property
    def slots(self) -> int:
        """Most nodes any process hosts (L): tags hold L*L (sender slot, receiver slot) pairs."""
        extra = self.num_nodes - self.world_size
        if extra <= 0:
            return 1
        per = -(-extra // len(self.switch_procs))
        return per + 1 if self.mode == "leader" else max(1, per)

    def proc(self, node: int) -> int:
        if node < self.world_size:
            return self.rank_procs[node]
        return self.switch_procs[(node - self.world_size) % len(self.switch_procs)]

    def slot(self, node: int) -> int:
        if node < self.world_size:
            return 0
        k = (node - self.world_size) // len(self.switch_procs)
        return k + 1 if self.mode == "leader" else k

    def hosted(self, proc: int) -> list[int]:
        """Nodes that run on process `proc`, in node order."""
        nodes = [r for r in range(self.world_size) if self.rank_procs[r] == proc]
        nodes += [s for s in range(self.world_size, self.num_nodes) if self.proc(s) == proc]
        return nodes


def leader_placement(world_size: int, num_nodes: int) -> Placement:
    """Ranks on themselves; switch node s on rank (s - p) % p."""
    ranks = tuple(range(world_size))
    return Placement(world_size, num_nodes, ranks, ranks)


def daemon_placement(world_size: int, num_nodes: int, app_procs: tuple[int, ...],
                     daemon_procs: tuple[int, ...]) -> Placement:
    """Ranks on their processes in the app+daemon communicator; switch nodes round-robin over the daemons."""
    if not daemon_procs:
        raise ValueError("daemon placement needs at least one switch daemon")
    return Placement(world_size, num_nodes, tuple(app_procs[:world_size]), tuple(daemon_procs))
