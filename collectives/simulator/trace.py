"""The event simulation as a Chrome trace (the JSON trace-event format Perfetto and chrome://tracing open).

One *process* per node (ranks first, then the switch nodes that take part), named after the node. In each:

* track "rounds": one slice per round the node takes part in, from entering it to leaving it, so a gap between
  a round's last message and its end is the node waiting (for a peer, or for its reduction);
* one track per link the node sends on ("out: <link>") and per link it receives from ("in: <link>"): a slice per
  message, from its start to the moment its last byte has left (sends) or landed (receives). Messages that
  share a link at the same time go on numbered sub-tracks of that link ("out: <link> #2"), so slices on one
  track never overlap.

Times are microseconds ("ts", "dur"), every slice is a complete event (`"ph": "X"`), and process and track
names are metadata events (`"ph": "M"`). Events carry the message's bytes, round and peer in "args".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

US = 1e6


def _tracks(start: np.ndarray, end: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per interval: its sub-track among those of the same key (greedy: the lowest free one, by start time)."""
    out = np.zeros(start.size, np.int64)
    free: dict[int, list[float]] = {}
    for i in np.lexsort((start, key)).tolist():
        ends = free.setdefault(int(key[i]), [])
        for j, e in enumerate(ends):
            if e <= start[i]:
                ends[j] = end[i]
                out[i] = j
                break
        else:
            out[i] = len(ends)
            ends.append(end[i])
    return out


def chrome_trace(result, node_label=None, link_label=None) -> dict:
    """A dict {"traceEvents": [...], ...} of `result`'s timeline (simulate(..., mode="event", trace=True))."""
    line = getattr(result, "trace", None)
    if not line:
        raise ValueError("this result has no timeline: simulate(..., mode='event', trace=True) records one")
    names, link_names = line.get("node_labels", {}), line.get("link_labels", {})
    node_label = node_label or (lambda n: names.get(n, f"rank {n}" if n < result.world_size else f"node {n}"))
    link_label = link_label or (lambda link: link_names.get(link, f"link {link}"))
    events: list[dict] = []
    tids: dict[tuple[int, str], int] = {}

    def tid(pid: int, name: str) -> int:
        key = (pid, name)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == pid]) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[key], "args": {"name": name}})
        return tids[key]

    nodes = sorted(set(line["src"].tolist()) | set(line["dst"].tolist()) | set(line["slot_node"].tolist()))
    for n in nodes:
        events.append({"ph": "M", "name": "process_name", "pid": int(n), "tid": 0, "args": {"name": node_label(n)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(n), "tid": 0, "args": {"sort_index": int(n)}})
    for n, r, a, b in zip(line["slot_node"].tolist(), line["slot_round"].tolist(), line["slot_start"].tolist(),
                          line["slot_end"].tolist(), strict=True):
        events.append({"ph": "X", "name": f"round {r}", "cat": "round", "pid": int(n), "tid": tid(int(n), "rounds"),
                       "ts": a * US, "dur": max(b - a, 0.0) * US, "args": {"round": int(r)}})
    src, dst, start = line["src"], line["dst"], line["start"]
    for side, node, peer, link, end in (("out", src, dst, line["first_link"], line["sent"]),
                                        ("in", dst, src, line["last_link"], line["arrival"])):
        sub = _tracks(start, end, node * (int(link.max(initial=0)) + 2) + link + 1)
        for i in range(src.size):
            name = f"{side}: {link_label(int(link[i])) if link[i] >= 0 else 'local'}"
            if sub[i]:
                name += f" #{int(sub[i]) + 1}"
            verb = "send to" if side == "out" else "recv from"
            events.append({"ph": "X", "name": f"{verb} {node_label(int(peer[i]))}", "cat": side,
                           "pid": int(node[i]), "tid": tid(int(node[i]), name), "ts": float(start[i]) * US,
                           "dur": max(float(end[i] - start[i]), 0.0) * US,
                           "args": {"bytes": float(line["nbytes"][i]), "round": int(line["round"][i]),
                                    "peer": int(peer[i])}})
    meta = {"algorithm": result.algorithm, "collective": result.collective, "topology": result.topology,
            "nbytes": result.nbytes, "protocol": result.protocol, "channels": result.channels,
            "time_us": result.time * US}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": meta}


def write_chrome_trace(result, path, node_label=None, link_label=None):
    """Write `chrome_trace(result)` to `path` (JSON) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(result, node_label, link_label)))
    return path


__all__ = ["chrome_trace", "write_chrome_trace"]
