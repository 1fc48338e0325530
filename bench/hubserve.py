"""Serve a local hub root from its own process: ``python -m bench.hubserve ROOT [RATE]``.

The benchmark runs the hub here rather than in the process under test so that, on a 2-core
machine, the server's threads do not share one GIL with the download threads (the real Hub
is another machine) and so that ``curl`` and ``k3a stage`` read from the same server. Prints
the endpoint on one line, then serves until stdin closes. ``RATE`` (bytes/s) paces every file
answer, as one TCP stream over a long path is paced.
"""

from __future__ import annotations

import sys
from pathlib import Path

from k3artifacts.localhub import LocalHub


def main() -> None:
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else None
    hub = LocalHub(Path(sys.argv[1]), stream_rate=rate)
    endpoint = hub.start()
    print(endpoint, flush=True)
    sys.stdin.read()
    hub.stop()
    if hub.server_errors:
        sys.stderr.write("\n".join(hub.server_errors))
        sys.exit(1)


if __name__ == "__main__":
    main()
