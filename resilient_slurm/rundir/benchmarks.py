"""`benchmarks.jsonl`: the benchmark scores of a run's checkpoints, one line per evaluated checkpoint.

Why a file of its own and not rows of `metrics.jsonl`: an evaluation runs beside training, as a job
of its own, and its scores arrive while training has moved on, many steps later. `metrics.jsonl`
holds one row per step with steps strictly increasing, and its readers rely on that: a resume
moves the rows after the resumed step to `metrics-lost.jsonl` (an older step's scores appended at
the end would be cut away, or would cut the timeline), the report counts productive time from its
rows in order, a search's feed reads its last row, and the trackers backfill it as the committed
history. A score row there would have to be written at its checkpoint's step, in the past. Here
each line carries the checkpoint's `step` in its own right, lines are in the order the scores
arrived (not by step), and nothing truncates them: a checkpoint that was evaluated stays
evaluated across restarts. The report and the trackers read this file beside metrics.jsonl and
show each score at its checkpoint's step (wandb: a `bench/step` x-axis, see tracking/).

Each line: `step`, `scores` (`{"tiny_mmlu/acc": 0.25, ...}`), `tasks`, `attempt` (1, or 2 for the
retry), `seconds`, `where` (local or the Slurm job id), and the UTC `time` it was written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from resilient_slurm.files import utc_stamp
from resilient_slurm.ledger import read_jsonl


def append_scores(path: Path, step: int, scores: dict[str, float], **fields: Any) -> None:
    """One line, written with one `write()` on an O_APPEND descriptor (evaluations may finish together)."""
    line = json.dumps({"step": step, "scores": scores, **fields, "time": utc_stamp()}) + "\n"
    with open(path, "a") as f:
        f.write(line)


def read_scores(path: Path) -> list[dict[str, Any]]:
    """Every complete line, in the order written."""
    return read_jsonl(path)


def latest_by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """The scores of each evaluated checkpoint (the last line for a step wins: an evaluation run
    again by hand replaces the earlier one), by step."""
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        out[int(row["step"])] = dict(row.get("scores") or {})
    return dict(sorted(out.items()))
