"""One benchmark evaluation of one checkpoint, start to end: what the side job (and
`python -m resilient_slurm.evaluate` by hand) runs.

1. Wait for the checkpoint to be committed: the run starts the evaluation right after asking for
   the save, which may still be writing in the background (`eval.harness.wait_commit_s` bounds it).
2. Export it to Hugging Face layout in `evals/step_N/hf`, streaming (export/from_checkpoint.py); a
   LoRA run's adapters are merged into their base, so lm-eval loads one plain model directory.
3. Release the checkpoint's retention pin (the run pinned it so that newer saves cannot delete it
   before it is read), run lm-eval on the export, then delete the export (it is as large as the
   model) and keep lm-eval's results.json.
4. Append the scores to benchmarks.jsonl at the checkpoint's step; ledger `eval_done`.

A failure is recorded (`eval_failed`, with the error) and the whole attempt runs once more; a
second failure is final. Nothing here can stop training: it runs in another process, and it
writes only its own files, benchmarks.jsonl and ledger lines.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from resilient_slurm.checkpoint import layout, store
from resilient_slurm.checkpoint.checkpointer import hot_root
from resilient_slurm.config import Config
from resilient_slurm.evaluate.harness import HarnessSettings, run_harness
from resilient_slurm.evaluate.tasks import include_paths
from resilient_slurm.export.from_checkpoint import DTYPES, export_checkpoint
from resilient_slurm.ledger import EvalDone, EvalFailed, EventLog
from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.benchmarks import append_scores

log = logging.getLogger("resilient_slurm")
ATTEMPTS = 2
"""The first attempt and its one retry."""
PIN_HOLDER = "eval"
POLL_S = 1.0


class EvalJobError(RuntimeError):
    """The checkpoint to evaluate is not there; one line naming it."""


@dataclass(frozen=True)
class Outcome:
    scores: dict[str, float] | None
    """None: both attempts failed."""
    errors: list[str]


def work_dir(run_dir: Path, step: int) -> Path:
    return RunDir(run_dir).evals / layout.step_dir_name(step)


def pin_path(root: Path, step: int) -> Path:
    return root / layout.PINS_DIR / f"{layout.step_dir_name(step)}.{PIN_HOLDER}"


def evaluate_checkpoint(run_dir: Path, cfg: Config, step: int, tasks: list[str] | None = None,
                        where: str = "local", device: str | None = None, wait_commit_s: float | None = None) -> Outcome:
    """Run the evaluation of step `step`'s checkpoint, retried once; never raises. `wait_commit_s`:
    how long to wait for the checkpoint's commit (default eval.harness.wait_commit_s; by hand, 0)."""
    events = EventLog(RunDir(run_dir).events, rank=-1)
    tasks = tasks or list(cfg.eval.harness.tasks)
    errors: list[str] = []
    root = hot_root(run_dir, cfg.checkpoint)
    try:
        for attempt in range(1, ATTEMPTS + 1):
            start = time.perf_counter()
            try:
                scores, export_s = _attempt(run_dir, cfg, root, step, tasks, device,
                                            cfg.eval.harness.wait_commit_s if wait_commit_s is None else wait_commit_s)
            except Exception as e:  # noqa: BLE001 - recorded and retried; an evaluation never stops training
                error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                errors.append(error)
                log.error("evaluation of step %d, attempt %d: %s\n%s", step, attempt, error, traceback.format_exc())
                events.emit(EvalFailed(error=error, attempt=attempt, final=attempt == ATTEMPTS), step)
                continue
            seconds = round(time.perf_counter() - start, 3)
            append_scores(RunDir(run_dir).benchmarks, step, scores, tasks=tasks, attempt=attempt, seconds=seconds, where=where)
            events.emit(EvalDone(scores=scores, attempt=attempt, seconds=seconds, export_seconds=round(export_s, 3)),
                        step)
            return Outcome(scores, errors)
        return Outcome(None, errors)
    finally:
        store.unpin(pin_path(root, step))


def _attempt(run_dir: Path, cfg: Config, root: Path, step: int, tasks: list[str], device: str | None,
             wait_s: float) -> tuple[dict[str, float], float]:
    h = cfg.eval.harness
    ckpt = root / layout.step_dir_name(step)
    deadline = time.monotonic() + wait_s
    while not (ckpt / layout.MANIFEST).is_file():
        if time.monotonic() > deadline:
            raise EvalJobError(f"{ckpt} is not a committed checkpoint (waited {wait_s:g} s, eval.harness.wait_commit_s); "
                               f"evaluate another step (ls {root}), or check the run's save events")
        time.sleep(POLL_S)
    work = work_dir(run_dir, step)
    work.mkdir(parents=True, exist_ok=True)
    hf = work / "hf"
    shutil.rmtree(hf, ignore_errors=True)
    start = time.perf_counter()
    export_checkpoint(ckpt, hf, cfg, DTYPES[h.dtype], cfg.checkpoint.io_threads,
                      merge=cfg.model.lora.rank is not None)
    export_s = time.perf_counter() - start
    store.unpin(pin_path(root, step))  # exported: newer saves may retire it now
    try:
        import torch

        settings = HarnessSettings(
            tasks=tasks, include_paths=include_paths(work, h.include_path), num_fewshot=h.num_fewshot, limit=h.limit,
            batch_size=h.batch_size, dtype=h.dtype, chat_template=h.chat_template,
            device=device or ("cuda" if torch.cuda.is_available() else "cpu"))
        scores = run_harness(hf, settings, work / "results.json")
    finally:
        shutil.rmtree(hf, ignore_errors=True)
    return scores, export_s


def lower_priority() -> None:
    """A local evaluation shares the machine with training: it yields the CPU (nice 19, one thread)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass
