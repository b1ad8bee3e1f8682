"""`python -m resilient_slurm.compare RUN_A RUN_B` (or `resilient-compare`): is B an honest ablation of A?

Prints the config keys that differ (those that change what the run computes, then placement and
logging keys, which do not), a warning when more than one variable changed, and the metric deltas
(B - A) at the steps both runs reached. Loading reads the two run directories; the rest is pure.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.metrics import read_metrics
from resilient_slurm.config import ConfigError, flatten, to_dict
from resilient_slurm.rundir.identity import MUTABLE_PREFIXES, changed_keys, load_config
from resilient_slurm.console import pipe_safe

METRICS = ("loss", "val_loss", "exact_match")
# Always different between two runs, so never worth listing.
_SAME_BY_NATURE = ("run.name",)
_POINTS = 6
"""Steps shown for a metric logged every step: evenly spread over the steps both runs reached."""


@dataclass(frozen=True)
class Comparison:
    variables: list[tuple[str, Any, Any]]
    """Differing keys that change what is computed: (key, A, B)."""
    placement: list[tuple[str, Any, Any]]
    """Differing keys of where and how the runs executed, saved and logged."""
    deltas: dict[str, list[tuple[int, float, float]]]
    """Per metric: (step, A, B) at steps both runs logged it."""

    @property
    def warning(self) -> str | None:
        n = len(self.variables)
        if n <= 1:
            return None
        return (f"an ablation should change one variable, these runs differ in {n}: "
                f"{', '.join(k for k, _, _ in self.variables)}; the deltas cannot be pinned on one of them")


def compare(config_a: dict[str, Any], config_b: dict[str, Any], rows_a: list[dict[str, Any]],
            rows_b: list[dict[str, Any]]) -> Comparison:
    """From two flat configs (`config.flatten`) and two runs' metrics rows. Pure."""
    diff = [(k, config_a.get(k), config_b.get(k)) for k in changed_keys(config_a, config_b)
            if k not in _SAME_BY_NATURE]
    return Comparison(
        variables=[d for d in diff if not d[0].startswith(MUTABLE_PREFIXES)],
        placement=[d for d in diff if d[0].startswith(MUTABLE_PREFIXES)],
        deltas={m: d for m in METRICS if (d := _matching(rows_a, rows_b, m))},
    )


def _matching(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], metric: str) -> list[tuple[int, float, float]]:
    a = {r["step"]: r[metric] for r in rows_a if r.get(metric) is not None}
    b = {r["step"]: r[metric] for r in rows_b if r.get(metric) is not None}
    common = sorted(a.keys() & b.keys())
    if len(common) > _POINTS:
        # Evenly spread, always ending at the last common step.
        common = [common[round(i * (len(common) - 1) / (_POINTS - 1))] for i in range(_POINTS)]
    return [(s, a[s], b[s]) for s in common]


def render(name_a: str, name_b: str, c: Comparison) -> str:
    lines = [f"A = {name_a}", f"B = {name_b}", ""]
    if c.variables:
        one = len(c.variables) == 1
        lines.append(f"{len(c.variables)} config key{'' if one else 's'} differ{'s' if one else ''}:")
        lines += [f"  {k:<32} {a!r} -> {b!r}" for k, a, b in c.variables]
    else:
        lines.append("no config key that changes what is computed differs")
    if c.placement:
        lines.append("placement and logging (do not change what is computed):")
        lines += [f"  {k:<32} {a!r} -> {b!r}" for k, a, b in c.placement]
    if c.warning:
        lines.append(f"warning: {c.warning}")
    lines.append("")
    if not c.deltas:
        lines.append("no metric logged at a step both runs reached")
    for metric, points in c.deltas.items():
        lines.append(f"{metric} at matching steps:")
        lines.append(f"  {'step':>8} {'A':>10} {'B':>10} {'B - A':>10}")
        lines += [f"  {s:>8} {a:>10.4f} {b:>10.4f} {b - a:>+10.4f}" for s, a, b in points]
    return "\n".join(lines) + "\n"


@pipe_safe
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resilient-compare", description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path, metavar="RUN_A")
    parser.add_argument("run_b", type=Path, metavar="RUN_B")
    args = parser.parse_args(argv)
    try:
        configs = [flatten(to_dict(load_config(run))) for run in (args.run_a, args.run_b)]
    except ConfigError as e:
        print(f"resilient_slurm.compare: {e}", file=sys.stderr)
        return 2
    rows = [read_metrics(RunDir(run).metrics) for run in (args.run_a, args.run_b)]
    print(render(str(args.run_a), str(args.run_b), compare(configs[0], configs[1], rows[0], rows[1])), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
