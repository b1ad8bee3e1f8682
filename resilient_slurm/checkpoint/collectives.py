"""What checkpoints need from the run's process group, as protocols: the package is typed against
these, never against the training loop's own class (`session.distributed.Comm` satisfies both, and
so does a process group a user's own loop made, wrapped by `Comm.adopt`)."""

from __future__ import annotations

from typing import Any, Protocol


class Collectives(Protocol):
    """What the save protocol needs: who this rank is, a barrier and an all-gather of small objects.
    A background save runs them on the checkpoint's own group (`group.checkpoint_group`)."""

    rank: int
    world_size: int

    def barrier(self) -> None: ...
    def all_gather_object(self, obj: Any) -> list[Any]: ...


class RunCollectives(Collectives, Protocol):
    """The run's own group, as the checkpointer and a resume use it: also the node each rank is on
    (a node-local tier) and a sum of flags over ranks (any rank's failed save counts)."""

    node: str

    @property
    def distributed(self) -> bool: ...
    def sum_floats(self, values: list[float]) -> list[float]: ...
