"""Exceptions raised by collectives."""


class CollectivesError(Exception):
    """Base class of the library's own errors."""


class ScheduleError(CollectivesError):
    """A schedule is wrong: a double or missing contribution, an unmatched message, a deadlock.

    Attributes name where: `node`, `op_index` (index in that node's program), `round`, `elements` (start, stop).
    """

    def __init__(self, message: str, *, node: int | None = None, op_index: int | None = None,
                 round: int | None = None, elements: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.op_index = op_index
        self.round = round
        self.elements = elements


class CollectiveTimeoutError(CollectivesError, TimeoutError):
    """A collective did not complete within its timeout.

    Attributes: `collective`, `algorithm`, `seq` (the call's sequence number on its communicator), `round`
    (the schedule round being executed, None before the first), `op_index` (program index of the first
    unfinished operation), `peers` (ranks or switch nodes awaited), `last_completed` (program index of the last
    completed operation, -1 if none), `timeout` (seconds).
    """

    def __init__(self, message: str, *, collective: str | None = None, algorithm: str | None = None,
                 seq: int | None = None, round: int | None = None, op_index: int | None = None,
                 peers: tuple[int, ...] = (), last_completed: int | None = None,
                 timeout: float | None = None) -> None:
        super().__init__(message)
        self.collective = collective
        self.algorithm = algorithm
        self.seq = seq
        self.round = round
        self.op_index = op_index
        self.peers = peers
        self.last_completed = last_completed
        self.timeout = timeout


class CommunicatorClosedError(CollectivesError, RuntimeError):
    """The communicator was closed (or failed) and takes no more calls."""


class CallMismatchError(CollectivesError, ValueError):
    """Ranks issued different calls (collective, count, dtype, op, root, algorithm, ...) on one communicator.

    Raised on every rank. `fields` maps each differing field to the value of every rank (a list, rank order).
    """

    def __init__(self, message: str, *, seq: int | None = None, fields: dict | None = None) -> None:
        super().__init__(message)
        self.seq = seq
        self.fields = fields or {}


class PeerFailedError(CollectivesError, RuntimeError):
    """MPI reported an error while talking to a peer (a dead rank or switch daemon): `peers` names them."""

    def __init__(self, message: str, *, collective: str | None = None, seq: int | None = None,
                 peers: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.collective = collective
        self.seq = seq
        self.peers = peers
