"""What the launcher hands the rank it starts a user's function in, and how the rank ended.

`run_entry` (runtime/entry.py) installs a `RankContext` around the user's function (`launched`);
a `Session` made inside takes its config, run directory, rank, stop request and hang callback from
it instead of building its own, and leaves how it ended (`RunOutcome`) there for the launcher's
recovery decision. The built-in trainer's rank returns its `RunOutcome` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resilient_slurm.config import Config
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.session.distributed import RankInfo

@dataclass(frozen=True)
class RunOutcome:
    code: ExitCode
    step: int | None
    signal: str | None = None
    """The stop signal that ended the run (SIGUSR1, ...), if one did."""
    error: str | None = None
    """`Type: message` of the exception that ended the run, or why it gave up, if either did."""
    peer_lost: str | None = None
    """A peer's death ended it (a collective failed), and this rank may restart in its process."""
    lost_at: float = 0.0
    """time.monotonic() when the peer's death was noticed (the teardown counts from there)."""


@dataclass(frozen=True)
class RankContext:
    """What the launcher already has for the rank it starts a user's function in: a `Session`
    created in that function takes these instead of building its own."""

    cfg: Config
    run_dir: Path
    info: RankInfo
    stop: StopRequest
    context: dict[str, Any] = field(default_factory=dict)
    on_hang: Callable[[int, str], None] | None = None
    outcomes: list[RunOutcome] = field(default_factory=list)
    """Where the session leaves how it ended, for the launcher's recovery decision."""


_launched: list[RankContext] = []


def launched(ctx: RankContext) -> _Installed:
    """`with launched(ctx): user_function(...)`: sessions made inside take `ctx`."""
    return _Installed(ctx)


class _Installed:
    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> RankContext:
        _launched.append(self.ctx)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        _launched.remove(self.ctx)


def current() -> RankContext | None:
    """The context of the function running now, if the launcher started it."""
    return _launched[-1] if _launched else None
