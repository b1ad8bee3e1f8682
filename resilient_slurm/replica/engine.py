"""The one seam between the trainer and what runs the replica groups' quorum, cross-group reduction
and healing (torchft today: `torchft_engine.py`).

Every rank of every live group calls, once per step and in this order: `quorum()` before the step
(who is live; a group that is behind heals here), `sum_()` for what the step adds up over the
groups, then `commit()` before its optimizer step: False means some rank saw a reduction fail, and
the step is dropped everywhere in its group and done again under the next quorum. Errors inside
`sum_` are not raised: they make `commit()` False (and `errored()` True at once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from resilient_slurm.session.replica_place import ReplicaPlace

class QuorumFailed(RuntimeError):
    """No quorum formed within the timeout (fewer live groups than cluster.replica_min, or the
    lighthouse is gone): this rank ends as any failed rank does, and its supervisor decides."""


@dataclass(frozen=True)
class Heal:
    """This group took the state from a live one at this quorum."""

    source: int
    """The group it healed from."""
    seconds: float
    """From the quorum's forming to the state installed: the transfer and the copy in."""
    bytes: int
    """What this rank received."""


@dataclass(frozen=True)
class Quorum:
    live: tuple[int, ...]
    """The groups in this step, lowest first."""
    step: int
    """The last step every live group has committed (the healed state's, after a heal)."""
    heal: Heal | None = None


class Replicas(Protocol):
    place: ReplicaPlace

    def quorum(self) -> Quorum: ...

    def sum_(self, tensor: torch.Tensor) -> None:
        """Sum in place over the same rank of every live group."""

    def errored(self) -> bool: ...

    def commit(self) -> bool: ...

    def abandon(self, reason: str) -> None:
        """This step is dropped whatever the reductions did (this group's own failure): `commit`
        is called, and says no."""

    def set_step(self, step: int) -> None:
        """The step this group's state is at, after a resume or a rollback from a checkpoint."""

    def close(self) -> None: ...


StateFns = tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None]]
"""What the engine sends a healing peer (called on a live rank), and installs what it received (on
the healing rank)."""
