"""What goes wrong with token data, as exceptions the trainer sorts by whether a restart helps."""

from __future__ import annotations

from resilient_slurm.errors import InputError


class TokenDataError(InputError):
    """Bad corpus files or data settings, or data changed under a run: one line naming the file or key
    and the fix. No restart helps (an InputError: exit status CONFIG)."""


class SourceExhausted(RuntimeError):
    """`data.on_exhausted=stop` and a source has no unseen sequence left for the next global batch."""

    def __init__(self, source: str, position: int) -> None:
        super().__init__(f"data source {source} is exhausted at global sequence {position} "
                         f"(data.on_exhausted=stop); the run ends here")
        self.source = source
        self.position = position
