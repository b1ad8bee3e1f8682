"""One rank's process group for in-process unit tests: created once per test process (a process
has one default group), shared by every test that needs collectives of a single rank."""

from __future__ import annotations

from resilient_slurm.session.distributed import Comm, RankInfo

_comm: Comm | None = None


def one_rank() -> Comm:
    global _comm
    if _comm is None:
        _comm = Comm(RankInfo(0, 1, 0, "127.0.0.1", 0))
    return _comm
