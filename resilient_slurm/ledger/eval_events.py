"""Benchmark evaluations beside training: launched, done, failed. The step is the checkpoint's."""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.ledger.kinds import Details, Kind


@dataclass(frozen=True, kw_only=True)
class EvalLaunched(Details):
    """The run started an evaluation of its checkpoint (a child process, or a Slurm job)."""

    KIND = Kind.EVAL_LAUNCHED
    tasks: list[str]
    where: str
    """local (a child process, `pid`), or slurm."""
    eval_job_id: str | None = None
    """The evaluation's own Slurm job (the header's job_id is the training job's)."""
    pid: int | None = None
    log: str | None = None


@dataclass(frozen=True, kw_only=True)
class EvalDone(Details):
    KIND = Kind.EVAL_DONE
    scores: dict[str, float]
    attempt: int
    seconds: float
    """Export and evaluation together."""
    export_seconds: float


@dataclass(frozen=True, kw_only=True)
class EvalFailed(Details):
    """An attempt failed; the first is retried once, the second is final. Training goes on either way."""

    KIND = Kind.EVAL_FAILED
    error: str
    attempt: int
    final: bool
