"""MSCCL-IR XML in and out: the format of MSCCLang, TACCL and TE-CCL, run by the MSCCL executor and RCCL.

* `read(path_or_text, *, count=None, inplace=None, root=None) -> Schedule`: an MSCCL program as a schedule that
  `verify`, `emulate` and `simulate` take unchanged (rounds from its dependency structure, its input, output and
  scratch buffers as the schedule's regions, local copies and reductions as messages to oneself). A wrong
  program is reported by the verifier naming the GPU, threadblock and step.
* `write(schedule, *, proto="Simple", channels=1, ...) -> str`: a schedule as a file the executor accepts.
* `export(algorithm, world_size, ...) -> str`: build a registered algorithm at a count whose chunks scale with
  the call's size, and write it.
"""

from __future__ import annotations

from ..schedule import Schedule
from .export import exact_count, export
from .fileformat import Algorithm, MscclFormatError, parse
from .lower import lower
from .writer import write


def read(path_or_text, *, count: int | None = None, inplace: bool | None = None, root: int | None = None) -> Schedule:
    """The schedule of an MSCCL-IR file (a path or the XML text).

    `count`: elements of each rank's input (the library's convention: allgather k, reduce_scatter and alltoall
    p*k); default the smallest count the executor runs the file at (one element per chunk). `inplace`: model the
    in-place call (MSCCL's aliased input and output buffers) or the out-of-place one; default out-of-place when
    the file allows it. `root` (broadcast, reduce): default the file's root attribute, else the one GPU that
    never receives (broadcast) or never sends (reduce).
    """
    algo = parse(path_or_text)
    return lower(algo, count, layout(algo, inplace), root)


def layout(algo: Algorithm, inplace: bool | None) -> bool:
    """True to model the in-place call."""
    if inplace is None:
        return not algo.outofplace
    if inplace and not algo.inplace:
        raise ValueError(f"{algo.source} is for out-of-place calls only (inplace=0)")
    if not inplace and not algo.outofplace:
        raise ValueError(f"{algo.source} is for in-place calls only (outofplace=0)")
    return bool(inplace)


__all__ = ["MscclFormatError", "exact_count", "export", "parse", "read", "write"]
