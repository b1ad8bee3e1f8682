"""`python -m resilient_slurm.simulate`: one long run at scale, simulated over many seeds.

    python -m resilient_slurm.simulate --gpus 10000 --gpus-per-node 8 --days 30 --gpu-mtbf-h 10000 \\
        --save-s 30 --blocking-s 2 --restart-s 600 --spares 16 --strategy young_daly --seeds 20 \\
        [--json] [--plot out.png] [--compare] [--from-bench FILE]

Costs come from the defaults (`scenario.Scenario`), then from `--from-bench` files (what the
project's benchmarks measured), then from the options given. Exit status 2 on bad input, with one
line naming the option and the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from resilient_slurm.simulate.failures import component_shares, parse_mix, with_mix
from resilient_slurm.simulate.report import compare, describe, detail
from resilient_slurm.simulate.results import Summary, simulate
from resilient_slurm.simulate.scenario import STRATEGIES, Scenario, from_bench

OPTIONS: dict[str, str] = {
    "gpus": "GPUs the run trains on",
    "gpus_per_node": "GPUs per node",
    "days": "length of the run (the window the GPUs are paid for)",
    "gpu_mtbf_h": "hours between failures of one GPU, all causes",
    "save_s": "a save from start to committed (a sync save blocks this long)",
    "blocking_s": "async saves: training time one save costs",
    "load_s": "load from the hot tier",
    "cold_load_s": "load from the cold tier",
    "cold_copy_s": "a checkpoint's copy to the cold tier",
    "restart_s": "a requeued job's start to its first step (load excluded)",
    "in_alloc_restart_s": "a restart inside the allocation (load excluded)",
    "queue_min_s": "shortest wait for nodes after a requeue",
    "queue_max_s": "longest wait for nodes after a requeue",
    "cred_delay_s": "Slurm's hold on a requeued job (cred_expire + 1)",
    "backfill_s": "scheduler pass interval (bf_interval)",
    "hang_detect_s": "a hang is found after this long (collective timeout)",
    "reset_s": "a GPU reset takes a node away this long",
    "manual_h": "hours until a person fixes what made the job give up",
    "spares": "spare nodes (strategies spares and elastic)",
    "min_nodes": "elastic floor in nodes (default: 98%% of the nodes)",
    "interval_min": "the fixed strategy's save interval",
    "step_s": "one training step",
    "planned_per_day": "planned stops (maintenance) per day",
    "price": "dollars per GPU-hour",
    "max_restarts": "restart budget (cluster.max_restarts)",
    "mtbf_prior_h": "Young-Daly's MTBF before any failure (checkpoint.mtbf_prior_h)",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m resilient_slurm.simulate",
                                description="Simulate one long training run at scale, decided by the project's code.")
    for name, text in OPTIONS.items():
        default = getattr(Scenario, name)
        kind = int if isinstance(default, int) or name == "min_nodes" else float
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help=f"{text} (default {default})")
    p.add_argument("--mix", help="failure shares by component, e.g. gpu=0.64,network=0.12,host=0.11,software=0.13 "
                                 "(default: the Llama 3 paper's)")
    p.add_argument("--strategy", default="young_daly", choices=list(STRATEGIES))
    p.add_argument("--seeds", type=int, default=20, help="runs to simulate (default 20)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--compare", action="store_true", help="one table across every strategy")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--plot", type=Path, help="write a PNG timeline of the first seed of --strategy")
    p.add_argument("--from-bench", type=Path, action="append", default=[],
                   help="JSON of measured costs (bench/checkpoint.py --json FILE); may repeat")
    return p


def scenario_from(args: argparse.Namespace) -> Scenario:
    """Defaults, then bench measurements, then the options given. Raises ValueError (one line)."""
    values: dict[str, Any] = {}
    for path in args.from_bench:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--from-bench {path}: cannot read it ({e}); give the file bench/checkpoint.py "
                             f"--json wrote") from None
        values.update(from_bench(raw, str(path)))
    values.update({name: getattr(args, name) for name in OPTIONS if getattr(args, name) is not None})
    if args.mix:
        values["faults"] = with_mix(Scenario.faults, parse_mix(args.mix))
    s = Scenario(**values)
    problems = s.validate()
    if args.seeds < 1:
        problems.append("--seeds: must be >= 1")
    if problems:
        raise ValueError(problems[0])
    return s


def to_json(s: Scenario, chosen: Summary, summaries: list[Summary]) -> dict[str, Any]:
    inputs = {k: v for k, v in dataclasses.asdict(s).items() if k != "faults"}
    inputs["mix"] = {k: round(v, 4) for k, v in component_shares(s.faults).items()}
    out = {**chosen.to_json(), "scenario": inputs}
    if len(summaries) > 1:
        out["strategies"] = {m.strategy: m.to_json() for m in summaries}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        s = scenario_from(args)
    except ValueError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    names = list(STRATEGIES) if args.compare else [args.strategy]
    summaries = []
    trace = None
    for name in names:
        summary, first = simulate(s, STRATEGIES[name], args.seeds, args.first_seed,
                                  trace=args.plot is not None and name == args.strategy)
        summaries.append(summary)
        trace = first if first is not None else trace
    chosen = next(m for m in summaries if m.strategy == args.strategy)
    if args.json:
        print(json.dumps(to_json(s, chosen, summaries)))
    else:
        print(compare(summaries) if args.compare else detail(chosen))
    if args.plot is not None and trace is not None:
        from resilient_slurm.simulate.plot import timeline

        timeline(trace, s.horizon_s, s.nodes, f"{args.strategy}, seed {args.first_seed}: {describe(s)}", args.plot)
        if not args.json:
            print(f"timeline of seed {args.first_seed}: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
