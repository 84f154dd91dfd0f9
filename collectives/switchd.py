"""`python -m collectives.switchd`: a switch daemon for in-network reduction (see collectives/transport/daemon.py)."""

from __future__ import annotations

import sys

from .transport.daemon import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
