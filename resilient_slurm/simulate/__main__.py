"""`python -m resilient_slurm.simulate`: one long run at scale, simulated over many seeds.

    python -m resilient_slurm.simulate --gpus 10000 --gpus-per-node 8 --days 30 --gpu-mtbf-h 10000 \\
        --save-s 30 --blocking-s 2 --restart-s 600 --spares 16 --strategy young_daly --seeds 20 \\
        [--json] [--plot out.png] [--compare | --losses] [--from-bench FILE ...] [--scale-to 8b-h100]

Costs come from the defaults (`scenario.Scenario`, each with its source in `scenario.SOURCES`),
then from `--from-bench` files (what the project's benchmarks measured: the keys in `bench.py`),
scaled to the target's hardware and model with `--scale-to` (the rules in `scaling.py`), then from
the options given. The report says where each cost came from: measured, scaled, published,
configured or assumed. `--losses` prints each loss's share of the run for `spares` and issue 23's
mechanisms added one at a time. Exit status 2 on bad input, with one line naming the option and
the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from resilient_slurm.console import pipe_safe, progress
from resilient_slurm.simulate import bench, scaling
from resilient_slurm.simulate.failures import component_shares, parse_mix, with_mix
from resilient_slurm.simulate.report import compare, describe, detail, losses
from resilient_slurm.simulate.results import Summary, simulate
from resilient_slurm.simulate.scenario import SOURCES, STEPS, STRATEGIES, Scenario

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
    "topup_nodes": "topup: nodes per spare top-up job (cluster.spare_topup)",
    "topup_at": "topup: ask once this many usable spares or fewer are left (cluster.spare_topup_at)",
    "min_nodes": "elastic floor in nodes (default: 98%% of the nodes)",
    "interval_min": "the fixed strategy's save interval",
    "step_s": "one training step",
    "planned_per_day": "planned stops (maintenance) per day",
    "price": "dollars per GPU-hour",
    "max_restarts": "restart budget (cluster.max_restarts)",
    "mtbf_prior_h": "Young-Daly's MTBF before any failure (checkpoint.mtbf_prior_h)",
    "heartbeat_s": "heartbeats: a silent rank is a hang after this long (monitor.heartbeat_timeout_s)",
    "crash_detect_s": "a crash: from the failure to the decision",
    "memory_every_steps": "memory tier: save every N steps (0: Young-Daly on its own cost)",
    "memory_blocking_s": "memory tier: training time a save blocks (the device-to-host copy)",
    "memory_save_s": "memory tier: a save until the own node's and the buddy's copies are committed",
    "memory_load_s": "memory tier: resume from the own node's memory",
    "buddy_load_s": "memory tier: resume from the buddy's memory",
    "placement_s": "in-process restart: the driver's placement",
    "teardown_s": "in-process restart: the survivors leave the broken process group",
    "replacement_start_s": "in-process restart: the replacement's processes start",
    "rendezvous_s": "in-process restart: every rank meets on the new store",
    "data_ready_s": "in-process restart: the data loader at the resumed position",
    "first_step_s": "in-process restart: the first step beyond a steady step",
    "comm_init_s": "creating the world's communicators after a restart (default: published, scaled to --gpus)",
    "replica_groups": "replica_ft: HSDP replica groups",
    "replica_min": "replica_ft: fewest live groups it trains on (default: a majority)",
    "quorum_s": "replica_ft: the survivors' stall when a group leaves or joins",
    "heal_s": "replica_ft: a group's heal from a live one (default: 1 s + its state at 50 GB/s)",
    "degraded_overhead": "replica_ft: the survivors' step short a group over the ideal R/(R-1)",
    "fingerprint_s": "sdc: the sentinel's cost per step",
    "sdc_gpu_mtbf_h": "hours of one GPU between silent data corruptions (0: none)",
    "sdc_nan_share": "share of silent data corruptions that end in NaN/Inf",
    "sdc_found_after_h": "without the sentinel: hours until a silent corruption is found",
    "straggler_gpu_mtbf_h": "hours of one GPU between fail-slow episodes (0: none)",
    "straggler_slowdown": "the run's step time while a straggler lasts, over normal",
    "straggler_duration_h": "mean hours a fail-slow episode lasts",
    "straggler_detect_s": "stragglers: an episode's start to the slow node's swap",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m resilient_slurm.simulate",
                                description="Simulate one long training run at scale, decided by the project's code.")
    for name, text in OPTIONS.items():
        default = getattr(Scenario, name)
        kind = int if isinstance(default, int) or name in ("min_nodes", "replica_min") else float
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help=f"{text} (default {default})")
    p.add_argument("--mix", help="failure shares by component, e.g. gpu=0.64,network=0.12,host=0.11,software=0.13 "
                                 "(default: the Llama 3 paper's)")
    p.add_argument("--strategy", default="young_daly", choices=list(STRATEGIES))
    p.add_argument("--seeds", type=int, default=20, help="runs to simulate (default 20)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--compare", action="store_true", help="one table across every strategy")
    p.add_argument("--losses", action="store_true",
                   help=f"each loss's share of the run for {', '.join(STEPS)} (issue 23's and 28's mechanisms one by one)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--plot", type=Path, help="write a PNG timeline of the first seed of --strategy")
    p.add_argument("--from-bench", type=Path, action="append", default=[],
                   help="JSON of measured costs (bench/checkpoint.py, bench/restart.py, bench/replica.py --json FILE); "
                        "may repeat")
    p.add_argument("--scale-to", choices=list(scaling.PROFILES),
                   help="scale the --from-bench costs to this model and hardware (rules: simulate/scaling.py)")
    return p


def inputs(args: argparse.Namespace) -> tuple[Scenario, dict[str, str]]:
    """Defaults, then bench measurements (scaled with --scale-to), then the options given, and
    where each cost came from. Raises ValueError (one line)."""
    values: dict[str, Any] = {}
    sources = dict(SOURCES)
    if args.scale_to and not args.from_bench:
        raise ValueError(f"--scale-to {args.scale_to}: nothing measured to scale; give --from-bench FILE "
                         f"(bench/checkpoint.py --json FILE, bench/restart.py --json FILE)")
    gpus = args.gpus if args.gpus is not None else Scenario.gpus
    timeouts = {"heartbeat_timeout_s": Scenario.heartbeat_s, "collective_timeout_s": Scenario.hang_detect_s}
    for path in args.from_bench:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--from-bench {path}: cannot read it ({e}); give the file bench/checkpoint.py "
                             f"--json or bench/restart.py --json wrote") from None
        found = bench.measured(raw, str(path))
        how: dict[str, str] = {}
        if args.scale_to:
            groups = args.replica_groups if args.replica_groups is not None else Scenario.replica_groups
            found, how = scaling.scale(found, scaling.PROFILES[args.scale_to], gpus, timeouts, str(path), groups)
        fields = bench.to_fields(found, str(path))
        values.update(fields)
        keys: dict[str, str] = {}
        for key, target in bench.BENCH_KEYS.items():  # lost_s before blocking_s, as to_fields prefers it
            if key in found:
                keys.setdefault(target, key)
        for name in fields:
            rule = how.get(keys.get(name, ""), "each part by its rule")
            sources[name] = f"scaled to {args.scale_to} from {path}: {rule}" if args.scale_to else f"measured: {path}"
    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name) is not None}
    values.update(given)
    sources.update({name: f"given: --{name.replace('_', '-')}" for name in given if name in sources})
    if args.mix:
        values["faults"] = with_mix(Scenario.faults, parse_mix(args.mix))
    s = Scenario(**values)
    problems = s.validate()
    if args.seeds < 1:
        problems.append("--seeds: must be >= 1")
    if problems:
        raise ValueError(problems[0])
    return s, sources


def scenario_from(args: argparse.Namespace) -> Scenario:
    return inputs(args)[0]


def to_json(s: Scenario, chosen: Summary, summaries: list[Summary], sources: dict[str, str]) -> dict[str, Any]:
    inputs = {k: v for k, v in dataclasses.asdict(s).items() if k != "faults"}
    inputs["mix"] = {k: round(v, 4) for k, v in component_shares(s.faults).items()}
    out = {**chosen.to_json(), "scenario": inputs, "sources": sources}
    if len(summaries) > 1:
        out["strategies"] = {m.strategy: m.to_json() for m in summaries}
    return out


@pipe_safe
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        s, sources = inputs(args)
    except ValueError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    names = list(STRATEGIES) if args.compare else list(STEPS) if args.losses else [args.strategy]
    if args.strategy not in names:
        names.append(args.strategy)
    summaries = []
    trace = None
    with progress(len(names) * args.seeds, "simulating", unit="run", leave=False) as bar:
        for name in names:
            bar.set_postfix_str(name, refresh=False)
            summary, first = simulate(s, STRATEGIES[name], args.seeds, args.first_seed,
                                      trace=args.plot is not None and name == args.strategy, on_seed=bar.update)
            summaries.append(summary)
            trace = first if first is not None else trace
    chosen = next(m for m in summaries if m.strategy == args.strategy)
    if args.json:
        print(json.dumps(to_json(s, chosen, summaries, sources)))
    elif args.compare:
        print(compare(summaries))
    elif args.losses:
        print(losses(summaries, sources))
    else:
        print(detail(chosen, sources))
    if args.plot is not None and trace is not None:
        from resilient_slurm.simulate.plot import timeline

        timeline(trace, s.horizon_s, s.nodes, f"{args.strategy}, seed {args.first_seed}: {describe(s)}", args.plot)
        if not args.json:
            print(f"timeline of seed {args.first_seed}: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
