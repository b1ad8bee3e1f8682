"""The tracker seam: what the training loop calls, whatever (if anything) records it.

Only rank 0 tracks; every other rank, and a run with tracking disabled, gets the `NullTracker`,
so call sites stay unconditional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Table:
    """A small table (sample predictions, ledger events) logged at a step."""

    columns: list[str]
    rows: list[list[Any]]


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, Any]) -> None:
        """Values (numbers, or `Table`s) of training step `step`; several calls for one step merge."""

    def commit(self, step: int) -> None:
        """Every step up to `step` is final: a checkpoint of `step` is committed, or the run finished."""

    def rewind(self, step: int) -> None:
        """The run went back to `step` (a rollback): drop the uncommitted rows after it."""

    def close(self, exit_code: int) -> None:
        """End this process's part of the run; steps logged after the last commit are dropped."""


class NullTracker:
    def log(self, step: int, values: dict[str, Any]) -> None:
        pass

    def commit(self, step: int) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass

    def close(self, exit_code: int) -> None:
        pass
