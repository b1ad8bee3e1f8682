"""`metrics.jsonl`: one line per training step, readable without any tracking server.

A resumed run first moves the lines after the step it resumed from to `metrics-lost.jsonl` (they
belong to work that was lost and is about to be redone), so `metrics.jsonl` holds exactly the
timeline that survived, its steps strictly increasing across restarts, while the report can still
count what the faults cost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from resilient_slurm.files import atomic_write, utc_stamp
from resilient_slurm.ledger import read_jsonl

LOST_SUFFIX = "-lost"


class MetricsFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def lost_path(self) -> Path:
        return lost_path(self.path)

    def append(self, row: dict[str, Any]) -> None:
        """One line: the row and the UTC `time` it was written (the report's timeline)."""
        with open(self.path, "a") as f:
            f.write(json.dumps({**row, "time": utc_stamp()}) + "\n")

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        """Move the rows after `step` to `metrics-lost.jsonl`; they are returned (a replay compares
        the steps it redoes with them)."""
        if not self.path.exists():
            return []
        rows = read_metrics(self.path)
        kept = [row for row in rows if row["step"] <= step]
        lost = [row for row in rows if row["step"] > step]
        if lost:
            # Appended before the rewrite: a crash in between can only count lost work twice, never drop it.
            with open(self.lost_path, "a") as f:
                f.write("".join(json.dumps(row) + "\n" for row in lost))
        atomic_write(self.path, "".join(json.dumps(row) + "\n" for row in kept))
        return lost


def lost_path(path: Path) -> Path:
    """`metrics-lost.jsonl` next to `metrics.jsonl`."""
    return path.with_name(f"{path.stem}{LOST_SUFFIX}{path.suffix}")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete rows of a metrics file."""
    return read_jsonl(path)
