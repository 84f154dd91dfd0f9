"""Validation shared by schedule builders, so every algorithm rejects a bad parameter the same way."""

from __future__ import annotations

import numpy as np


def check_chunks(algorithm: str, chunks: object, meaning: str = "pipeline segments") -> int:
    """`chunks` as an int >= 1, or ValueError naming the algorithm, the value and what would be right."""
    if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
        raise ValueError(f"{algorithm} chunks ({meaning}) must be an integer >= 1, got {chunks!r}")
    return int(chunks)
