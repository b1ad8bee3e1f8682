"""The run's quorum server (torchft's lighthouse), in a process of its own beside the supervisor.

The local launcher and the job's driver import no torch, and torchft's package does: the lighthouse
runs as `python -m resilient_slurm.replica.lighthouse`, prints its address on its first line, and
lives until its parent goes (stdin closes) or it is terminated. A group is dropped from the
quorum when its heartbeat (from its rank 0, every 100 ms) has been silent `HEARTBEAT_TIMEOUT_S`,
or when it is alive but has not asked to join `cluster.replica_timeout_s` after the others did.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HEARTBEAT_TIMEOUT_S = 3.0
"""A group whose processes died is left after this: torchft's default is 5 s; its heartbeats come
from a thread of their own, which a busy training step does not hold up."""


class Lighthouse:
    def __init__(self, min_replicas: int, join_timeout_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "resilient_slurm.replica.lighthouse", str(min_replicas), str(join_timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http"):
            self.close()
            raise RuntimeError(f"the replica lighthouse did not start (exit {self.proc.poll()}): {line!r}")
        self.address = line
        """`http://host:port`, what every rank's Manager connects to."""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilient_slurm.replica.lighthouse")
    parser.add_argument("min_replicas", type=int)
    parser.add_argument("join_timeout_s", type=float)
    args = parser.parse_args(argv)
    os.environ.setdefault("RUST_LOG", "warn")  # every quorum at info otherwise
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=args.min_replicas,
                              join_timeout_ms=int(args.join_timeout_s * 1000),
                              heartbeat_timeout_ms=int(HEARTBEAT_TIMEOUT_S * 1000))
    print(server.address(), flush=True)
    sys.stdin.read()  # until the parent closes it, or goes
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
