"""What a lost replica group costs a run with per-step fault tolerance (cluster.replica_ft), on this
machine: the survivors' stall and slower steps, and the replacement's heal from a live group, next
to a load of the same state from the memory tier and from disk.

    python bench/replica.py [--groups 2,3] [--repeats 1] [--steps 80] [--hidden 256] [--layers 4]
                            [--json FILE]

For each number of groups (parallel.dp_replicate, one rank per group, cluster=local: the local
launcher runs the groups and the lighthouse, and replaces a lost group in place) and repeat, a run
of `--steps` steps is launched, and at step KILL_AT the bench SIGKILLs the last group's process
(found by its environment), what a node that dies looks like. It then reads the run's metrics and
ledger:
- steady: the median step with every group live (`replica_missing` 0, after the first 5 steps);
- short: the survivors' median step while a group is missing (against steady * G/(G-1), the ideal
  of taking its micro-batches as extra accumulation);
- survivors' next step: the kill to the survivors' first step after it (bench clock to metrics);
- leave stall: that, less one short step (the failed step's part, the lighthouse dropping the
  group, the new quorum); join stall: the survivors' step in which the replacement joined, less a
  steady step; quorum = the median of both (what the simulator charges per change of the quorum);
- heal: the replacement's transfer and install of the state from a live group (`replica_heal`:
  seconds from the quorum to the state installed, and its bytes), and its whole join (`replica_join`:
  its processes' start to its first step in the quorum);
- loads: a one-rank run of the same model (no replica groups) paused at step 10 with a memory-tier
  and a disk checkpoint there, relaunched twice: once loading the memory tier (`resume` seconds,
  source memory), then without it, from disk (source hot; the page cache dropped first when this
  process may, else said "warm").
Runs alternate the order of the group counts between repeats; the table shows medians.

`--json FILE` writes the keys the simulator reads for bench/replica.py (resilient_slurm/simulate/bench.py,
`python -m resilient_slurm.simulate --from-bench FILE`), measured at the first --groups value:
ranks, replica_groups, steady_step_s, short_step_s, quorum_s, heal_s (the join: process start to
first step), heal_bytes, survivors_next_step_s; and, null until their benches fill them,
fingerprint_s and sdc_heal_s (the SDC sentinel), straggler_found_s, straggler_swap_s and
hang_culprit_s (stragglers and hang culprits).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resilient_slurm.files import stamp_seconds  # noqa: E402
from resilient_slurm.ledger import ReplicaHeal, ReplicaJoin, Resume, read_events, select  # noqa: E402
from resilient_slurm.process.launch import RankLaunch  # noqa: E402
from resilient_slurm.rundir.metrics import read_metrics  # noqa: E402

GROUP = RankLaunch.variable("replica_group")
"""The variable that names a rank's replica group (how the bench finds a group's processes)."""

KILL_AT = 30
WARMUP = 5
PAUSE_AT = 10
FILLED_BY_OTHERS = ("fingerprint_s", "sdc_heal_s", "straggler_found_s", "straggler_swap_s", "hang_culprit_s")
KEYS = ("ranks", "replica_groups", "steady_step_s", "short_step_s", "quorum_s", "heal_s", "heal_bytes",
        "survivors_next_step_s", *FILLED_BY_OTHERS)
"""What --json writes: simulate/bench.py's keys for this bench."""


def model(hidden: int, layers: int) -> list[str]:
    return ["+experiment=tiny_sft", f"model.hidden_size={hidden}", f"model.intermediate_size={hidden * 8 // 3}",
            f"model.num_layers={layers}", "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=128",
            "data.global_batch_size=12", "data.micro_batch_size=2", "optim.warmup_steps=5", "eval.every_steps=0",
            "train.log_every_steps=20", "train.threads=1", "tracking.mode=disabled", "checkpoint.every_steps=1000",
            "checkpoint.every_minutes=0"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="2,3", help="numbers of replica groups to measure")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=80, help=f"train.max_steps of each run (> {KILL_AT + 20})")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the simulator's keys here")
    args = parser.parse_args(argv)
    counts = [int(g) for g in args.groups.split(",") if g]
    if not counts or min(counts) < 2 or args.steps <= KILL_AT + 20:
        sys.exit(f"bench/replica.py: --groups {args.groups} --steps {args.steps}: choose 2 or more groups and more "
                 f"than {KILL_AT + 20} steps")
    base = model(args.hidden, args.layers)
    root = Path(tempfile.mkdtemp(prefix="bench-replica-"))
    load = os.getloadavg()[0]
    runs: dict[int, list[dict[str, Any]]] = {g: [] for g in counts}
    for i in range(args.repeats):
        for g in counts if i % 2 == 0 else counts[::-1]:
            r = kill_run(root, f"g{g}-{i}", [*base, f"cluster.ranks={g}", f"parallel.dp_replicate={g}",
                                             "cluster.replica_ft=true", f"train.max_steps={args.steps}"], g)
            runs[g].append(r)
            print(f"  {g} groups, run {i}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()
                                                          if isinstance(v, float)), flush=True)
    loads = load_runs(root, base)
    print(f"\nload average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (2 cores, shared); "
          f"one rank per group, the local launcher; model hidden {args.hidden} x {args.layers} layers; runs under "
          f"{root}\n")
    medians = {g: summarize(rs) for g, rs in runs.items()}
    print(table(medians, loads))
    if args.json:
        first = counts[0]
        out = simulator_keys(medians[first], first)
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"\nwrote {args.json} ({first} groups)")
    shutil.rmtree(root, ignore_errors=True)
    return 0


def launch(root: Path, name: str, extra: list[str]) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-m", "resilient_slurm.launch", f"run.root={root}", f"run.name={name}",
                             *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    return proc, root / "tiny_sft" / name


def kill_run(root: Path, name: str, extra: list[str], groups: int) -> dict[str, Any]:
    proc, rdir = launch(root, name, extra)
    wait(lambda: last_step(rdir) >= KILL_AT, 600, f"step {KILL_AT} of {name}", proc)
    victim = group_pid(rdir, groups - 1)
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=1200)
    if proc.returncode != 0:
        sys.exit(f"bench/replica.py: {name} exited {proc.returncode}:\n{out[-3000:]}")
    return measure(read_metrics(rdir / "metrics.jsonl"), read_events(rdir / "events.jsonl"), killed_at, groups)


def measure(rows: list[dict[str, Any]], events: list[Any], killed_at: float, groups: int) -> dict[str, Any]:
    """One run's figures from its metrics rows and ledger. Pure."""
    steady = [r["step_seconds"] for r in rows if not r.get("replica_missing") and r["step"] > WARMUP
              and stamp_seconds(r["time"]) < killed_at]
    short = [r for r in rows if r.get("replica_missing")]
    after = [r for r in rows if stamp_seconds(r["time"]) > killed_at]
    heal = select(events, ReplicaHeal)
    join = select(events, ReplicaJoin)
    out: dict[str, Any] = {"steady_step_s": statistics.median(steady) if steady else None,
                           "short_step_s": statistics.median(r["step_seconds"] for r in short) if short else None}
    if after and out["short_step_s"] is not None:
        out["survivors_next_step_s"] = stamp_seconds(after[0]["time"]) - killed_at
        out["leave_stall_s"] = out["survivors_next_step_s"] - out["short_step_s"]
    joined = [r for r in rows if join and r["step"] == join[0].step]
    before = [r for r in rows if joined and r["step"] == joined[0]["step"] - 1]
    if joined and before and out["steady_step_s"] is not None:
        out["join_stall_s"] = stamp_seconds(joined[0]["time"]) - stamp_seconds(before[0]["time"]) - out["steady_step_s"]
    if heal:
        out["heal_transfer_s"], out["heal_bytes"] = heal[0].details.seconds, float(heal[0].details.bytes)
    if join:
        out["heal_s"] = join[0].details.seconds
    out["short_steps"] = float(len(short))
    out["ideal_short_step_s"] = None if out["steady_step_s"] is None else out["steady_step_s"] * groups / (groups - 1)
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of every figure; quorum_s over both stalls of every run. Pure."""
    keys = {k for r in runs for k in r}
    out = {k: statistics.median(v) for k in keys if (v := [r[k] for r in runs if r.get(k) is not None])}
    stalls = [r[k] for r in runs for k in ("leave_stall_s", "join_stall_s") if r.get(k) is not None]
    out["quorum_s"] = statistics.median(stalls) if stalls else None
    return out


def simulator_keys(m: dict[str, Any], groups: int) -> dict[str, Any]:
    """Exactly KEYS: what simulate/bench.py reads from this bench (or reports), null where not measured. Pure."""
    got = {"ranks": groups, "replica_groups": groups, **{k: m.get(k) for k in KEYS[2:]}}
    return {k: (None if got.get(k) is None else round(float(got[k]), 4)) for k in KEYS}


def load_runs(root: Path, base: list[str]) -> dict[str, Any]:
    """The same state loaded by a resume: from the memory tier, then (without it) from disk."""
    name = "loads"
    memory = Path(tempfile.mkdtemp(prefix="bench-replica-shm-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    extra = [*base, "cluster.ranks=1", "checkpoint.memory.every_steps=5", f"checkpoint.memory.dir={memory}",
             f"train.max_steps={PAUSE_AT + 5}"]
    out: dict[str, Any] = {}
    try:
        for leg, pause in (("save", PAUSE_AT), ("memory", PAUSE_AT + 1), ("disk", PAUSE_AT + 2)):
            if leg == "disk":
                shutil.rmtree(memory, ignore_errors=True)
                out["disk_cache"] = "cold" if drop_caches() else "warm"
            proc, rdir = launch(root, name, [*extra, f"train.pause_at_step={pause}"])
            text, _ = proc.communicate(timeout=600)
            if proc.returncode != 75:
                sys.exit(f"bench/replica.py: the load run ({leg}) exited {proc.returncode}:\n{text[-3000:]}")
            if leg != "save":
                resume = select(read_events(rdir / "events.jsonl"), Resume)[-1].details
                out[f"{leg}_load_s"], out[f"{leg}_source"] = resume.seconds, resume.source
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    return out


def table(medians: dict[int, dict[str, Any]], loads: dict[str, Any]) -> str:
    rows = [("steady step (s)", "steady_step_s"), ("short step (s)", "short_step_s"),
            ("  ideal: steady x G/(G-1) (s)", "ideal_short_step_s"), ("steps short of a group", "short_steps"),
            ("kill -> survivors' next step (s)", "survivors_next_step_s"), ("leave stall (s)", "leave_stall_s"),
            ("join stall (s)", "join_stall_s"), ("quorum: median stall (s)", "quorum_s"),
            ("heal: transfer + install (s)", "heal_transfer_s"), ("heal: bytes per rank", "heal_bytes"),
            ("join: process start -> first step (s)", "heal_s")]
    counts = sorted(medians)
    lines = [f"{'':<40}" + "".join(f"{f'{g} groups':>12}" for g in counts)]
    for label, key in rows:
        cells = [medians[g].get(key) for g in counts]
        lines.append(f"{label:<40}" + "".join(f"{'-' if v is None else f'{v:.4g}':>12}" for v in cells))
    lines.append("")
    lines.append(f"{'load of the same state, 1 rank':<40}")
    lines.append(f"{'  from the memory tier (s)':<40}{_cell(loads.get('memory_load_s')):>12}   "
                 f"(source {loads.get('memory_source')})")
    lines.append(f"{'  from disk (s)':<40}{_cell(loads.get('disk_load_s')):>12}   "
                 f"(source {loads.get('disk_source')}, page cache {loads.get('disk_cache')})")
    return "\n".join(lines)


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def group_pid(rdir: Path, group: int) -> int:
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if b"resilient_slurm.runtime.rank" in argv and str(rdir).encode() in argv and \
                f"{GROUP}={group}".encode() in env:
            return int(proc.name)
    sys.exit(f"bench/replica.py: no process of replica group {group} of {rdir}")


def last_step(rdir: Path) -> int:
    path = rdir / "metrics.jsonl"
    return max((r["step"] for r in read_metrics(path)), default=0) if path.exists() else 0


def wait(done: Any, timeout_s: float, what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        if proc.poll() is not None:
            sys.exit(f"bench/replica.py: the run ended ({proc.returncode}) before {what}")
        time.sleep(0.05)
    sys.exit(f"bench/replica.py: no {what} in {timeout_s:.0f} s")


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
