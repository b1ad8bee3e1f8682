"""What a lost rank costs a run, part by part, on each restart path, and how fast a hang is found,
on the local Slurm sandbox.

    tools/slurm_sandbox up; source /tmp/resilient_slurm_sandbox/env
    python bench/restart.py [--repeats 2] [--paths inprocess,nostandby,step,requeue] [--hangs heartbeat,collective]
                            [--steps 200] [--json FILE]

The same tiny run (2 nodes x 1 rank, a checkpoint every 25 steps) is submitted once per path and
repeat, the paths' order alternating between repeats. At step 60 the bench SIGKILLs rank 1's
process (found by pid in the run's newest `start` event), which is what a node that dies looks like
from the job: the process is gone without a trace. The paths:
- inprocess: a spare node, cluster.restart_in_process=true (the default): rank 0 goes on in its own
  process, rank 1 is the process that stood by on the spare (cluster.standby, the default), woken;
- nostandby: the same without the standby: rank 1's process starts on the spare after the failure;
- step: a spare node, cluster.restart_in_process=false: every process starts anew;
- requeue: no spare: the job goes back to the queue (on this idle sandbox the wait is short; on a
  busy cluster it is the queue's).
The hang runs SIGSTOP rank 1 at step 60 instead: `heartbeat` finds it by its silent heartbeats
(monitor.heartbeat_timeout_s), `collective` with heartbeats off, by the collective timeout
(cluster.collective_timeout_s); both with a spare. Detection is the stop to the first `hang` or
`crash` event after it.

It prints each run and a table of medians: each part of the restart as the driver recorded it
(`restart_in_allocation.breakdown`, supervise/restarts.py; for a requeue, the same parts from the
ledger: detect = the kill to the first crash recorded, teardown = to the requeue, placement = the
queue to the first new process, then as the others), the whole from the kill to the next first
step by the bench's own clock, steps lost and goodput. Parts may overlap (an in-process survivor
tears down while the driver decides), so they need not add up to the whole.

`--json FILE` writes the medians under the keys the simulator reads (resilient_slurm/simulate/bench.py,
`python -m resilient_slurm.simulate --from-bench FILE`): ranks, steady_step_s, crash_detect_s,
heartbeat_timeout_s, heartbeat_detect_s, collective_timeout_s, collective_detect_s,
<path>_<part>_s for each part, <path>_restart_s (the kill to the first step) and <path>_load_source.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from resilient_slurm.analysis.goodput import BREAKDOWN_PARTS, account  # noqa: E402
from resilient_slurm.files import stamp_seconds  # noqa: E402
from resilient_slurm.ledger import (  # noqa: E402
    Crash,
    DataReady,
    Hang,
    Requeue,
    RestartInAllocation,
    Resume,
    Start,
    read_events,
    select,
)
from resilient_slurm.rundir.metrics import lost_path, read_metrics  # noqa: E402

TINY = ["+experiment=tiny_sft", "model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
        "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=64", "data.global_batch_size=4",
        "data.micro_batch_size=2", "optim.warmup_steps=10", "train.log_every_steps=50", "checkpoint.every_steps=25",
        "eval.every_steps=0", "train.threads=1", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1",
        "cluster.time_min=10", "fault.step_sleep_s=0.05", "tracking.mode=disabled"]
SPARE = ["cluster.spare_nodes=1"]
PATHS = {"inprocess": SPARE, "nostandby": [*SPARE, "cluster.standby=false"],
         "step": [*SPARE, "cluster.restart_in_process=false"], "requeue": []}
HEARTBEAT_TIMEOUT_S = 10.0
COLLECTIVE_TIMEOUT_S = 30.0
HANGS = {"heartbeat": [*SPARE, f"monitor.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S:g}",
                       f"cluster.collective_timeout_s={COLLECTIVE_TIMEOUT_S * 4:g}"],
         "collective": [*SPARE, "monitor.heartbeat_timeout_s=0", f"cluster.collective_timeout_s={COLLECTIVE_TIMEOUT_S:g}"]}
FAULT_AT_STEP = 60
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)}")
    parser.add_argument("--hangs", default=",".join(HANGS), help=f"of {', '.join(HANGS)} (empty: none)")
    parser.add_argument("--steps", type=int, default=200, help="train.max_steps of each run (> 60)")
    parser.add_argument("--json", type=Path, help="write the medians for the simulator here")
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    hangs = [h for h in args.hangs.split(",") if h]
    unknown = sorted(set(paths) - set(PATHS)) + sorted(set(hangs) - set(HANGS))
    if unknown or args.steps <= FAULT_AT_STEP + 5:
        sys.exit(f"bench/restart.py: {', '.join(unknown) or f'--steps {args.steps}'}: choose paths of "
                 f"{', '.join(PATHS)}, hangs of {', '.join(HANGS)}, and more than {FAULT_AT_STEP + 5} steps")
    if "SLURM_CONF" not in os.environ:
        sys.exit("bench/restart.py: no SLURM_CONF; run tools/slurm_sandbox up and source its env file")
    root = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    load = os.getloadavg()[0]
    crashes: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    detects: dict[str, list[float]] = {h: [] for h in hangs}
    for i in range(args.repeats):
        for path in paths if i % 2 == 0 else paths[::-1]:
            r = crash_run(root, f"{path}-{i}", [*PATHS[path], f"train.max_steps={args.steps}"])
            crashes[path].append(r)
            print(f"  {path}-{i}: {one_line(r)}", flush=True)
        for hang in hangs if i % 2 == 0 else hangs[::-1]:
            detects[hang].append(hang_run(root, f"hang-{hang}-{i}", [*HANGS[hang], f"train.max_steps={args.steps}"]))
            print(f"  hang-{hang}-{i}: found after {detects[hang][-1]:.1f}s", flush=True)
    print(f"\nload average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (2 cores, shared); "
          f"2 nodes x 1 rank, the sandbox's nodes on one machine; runs under {root}\n")
    medians = summarize(crashes, detects)
    print(table(medians, paths, hangs, args.repeats))
    if args.json:
        args.json.write_text(json.dumps(medians, indent=1, sort_keys=True) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def submit(root: Path, name: str, extra: list[str]) -> tuple[str, Path]:
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.launch", *TINY, f"run.root={root}",
                           f"run.name={name}", *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
    found = re.search(r"submitted job (\d+)", done.stdout)
    if done.returncode or found is None:
        sys.exit(f"bench/restart.py: launch failed:\n{done.stdout}{done.stderr}")
    return found.group(1), root / "tiny_sft" / name


def crash_run(root: Path, name: str, extra: list[str]) -> dict[str, Any]:
    job, rdir = submit(root, name, extra)
    wait(lambda: last_step(rdir) >= FAULT_AT_STEP, 300, f"step {FAULT_AT_STEP} of {name}")
    killed_at = time.time()
    os.kill(rank_pid(rdir, 1), signal.SIGKILL)
    wait(lambda: job_state(job) in FINISHED, 600, f"job {job} to end")
    events = read_events(rdir / "events.jsonl")
    kept = read_metrics(rdir / "metrics.jsonl")
    acc = account(events, kept, read_metrics(lost_path(rdir / "metrics.jsonl")))
    if len(acc.attempts) < 2 or not acc.finished:
        sys.exit(f"bench/restart.py: {name} did not restart and finish: {[a.outcome for a in acc.attempts]}")
    after = [stamp_seconds(r["time"]) for r in kept if stamp_seconds(r["time"]) > killed_at]
    records = select(events, RestartInAllocation)
    if records:
        parts = dict(records[0].details.breakdown or {})
        path = records[0].details.path
    else:
        parts, path = requeue_parts(events, killed_at, min(after) if after else None), "requeue"
    steps = [r["step_seconds"] for r in kept if r.get("step_seconds") and stamp_seconds(r["time"]) < killed_at]
    return {"path": path, **parts, "restart": min(after) - killed_at if after else None,
            "steps_lost": float(acc.steps_lost), "goodput": acc.time.goodput,
            "steady_step": statistics.median(steps) if steps else None}


def requeue_parts(events: list[Any], killed_at: float, first_step_at: float | None) -> dict[str, Any]:
    """The parts of a restart through the queue, from the ledger (the driver records none)."""
    def first(kind: type, since: float) -> Any:
        return next((e for e in select(events, kind) if stamp_seconds(e.time) >= since), None)  # type: ignore[var-annotated]

    crash, requeue = first(Crash, killed_at), first(Requeue, killed_at)
    start, resume, ready = first(Start, killed_at), first(Resume, killed_at), first(DataReady, killed_at)
    process = [stamp_seconds(s) for s in (start.details.process_starts or []) if s] if start else []
    rendezvous = start.details.rendezvous_s or 0.0 if start else 0.0
    parts = {
        "detect": stamp_seconds(crash.time) - killed_at if crash else None,
        "teardown": stamp_seconds(requeue.time) - stamp_seconds(crash.time) if crash and requeue else None,
        "placement": min(process) - stamp_seconds(requeue.time) if process and requeue else None,
        "process_start": stamp_seconds(start.time) - rendezvous - min(process) if process and start else None,
        "rendezvous": rendezvous if start else None,
        "load": resume.details.seconds if resume else None,
        "data_ready": ready.details.seconds if ready else None,
        "first_step": first_step_at - stamp_seconds(resume.time) if resume and first_step_at else None,
    }
    return {**{k: None if v is None else round(max(v, 0.0), 3) for k, v in parts.items()},
            "load_source": resume.details.source if resume else None}


def hang_run(root: Path, name: str, extra: list[str]) -> float:
    job, rdir = submit(root, name, extra)
    wait(lambda: last_step(rdir) >= FAULT_AT_STEP, 300, f"step {FAULT_AT_STEP} of {name}")
    pid = rank_pid(rdir, 1)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        found = wait(lambda: first_after(rdir, stopped_at), 300, f"the hang in {name} to be found")
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    wait(lambda: job_state(job) in FINISHED, 120, f"job {job} to end")
    return found - stopped_at


def first_after(rdir: Path, since: float) -> float | None:
    """When the first hang or crash after `since` was recorded: the hang found."""
    times = [stamp_seconds(e.time) for e in read_events(rdir / "events.jsonl")
             if isinstance(e.details, (Hang, Crash)) and stamp_seconds(e.time) >= since]
    return min(times) if times else None


def summarize(crashes: dict[str, list[dict[str, Any]]], detects: dict[str, list[float]]) -> dict[str, Any]:
    """Medians under the simulator's keys (simulate/bench.py)."""
    out: dict[str, Any] = {"ranks": 2}
    steady = [r["steady_step"] for runs in crashes.values() for r in runs if r["steady_step"] is not None]
    if steady:
        out["steady_step_s"] = round(statistics.median(steady), 4)
    for path, runs in crashes.items():
        for key in (*BREAKDOWN_PARTS, "restart"):
            values = [r[key] for r in runs if r.get(key) is not None]
            if values:
                out[f"{path}_{key}_s"] = round(statistics.median(values), 3)
        sources = sorted({r["load_source"] for r in runs if r.get("load_source")})
        if sources:
            out[f"{path}_load_source"] = ",".join(sources)
        out[f"{path}_steps_lost"] = statistics.median(r["steps_lost"] for r in runs) if runs else None
        goodputs = [r["goodput"] for r in runs if r["goodput"] is not None]
        out[f"{path}_goodput"] = round(statistics.median(goodputs), 4) if goodputs else None
    detected = [out[f"{p}_detect_s"] for p in crashes if p != "requeue" and f"{p}_detect_s" in out]
    if detected:
        out["crash_detect_s"] = round(statistics.median(detected), 3)
    for hang, values in detects.items():
        if values:
            out[f"{hang}_detect_s"] = round(statistics.median(values), 3)
            out[f"{hang}_timeout_s"] = HEARTBEAT_TIMEOUT_S if hang == "heartbeat" else COLLECTIVE_TIMEOUT_S
    return out


def table(m: dict[str, Any], paths: list[str], hangs: list[str], repeats: int) -> str:
    def cell(key: str, unit: str = "s") -> str:
        value = m.get(key)
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        return f"{100 * value:.1f}%" if unit == "%" else f"{value:.2f}{unit}"

    rows = [f"{'median of ' + str(repeats) + ' run(s)':<26}" + "".join(f"{p:>12}" for p in paths)]
    for part in BREAKDOWN_PARTS:
        rows.append(f"{part:<26}" + "".join(f"{cell(f'{p}_{part}_s'):>12}" for p in paths))
    rows.append(f"{'load from':<26}" + "".join(f"{cell(f'{p}_load_source'):>12}" for p in paths))
    rows.append(f"{'kill -> first step':<26}" + "".join(f"{cell(f'{p}_restart_s'):>12}" for p in paths))
    rows.append(f"{'steps lost':<26}" + "".join(f"{cell(f'{p}_steps_lost', ''):>12}" for p in paths))
    rows.append(f"{'goodput (of allocated)':<26}" + "".join(f"{cell(f'{p}_goodput', '%'):>12}" for p in paths))
    for hang in hangs:
        rows.append(f"hang found by {hang} (timeout {cell(f'{hang}_timeout_s')}): {cell(f'{hang}_detect_s')}")
    return "\n".join(rows)


def one_line(r: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {r[k]:.2f}" for k in BREAKDOWN_PARTS if r.get(k) is not None)
    return f"{r['path']}: kill -> first step {r['restart'] or 0:.1f}s ({parts}; from {r.get('load_source')})"


def last_step(rdir: Path) -> int:
    rows = read_metrics(rdir / "metrics.jsonl") if (rdir / "metrics.jsonl").exists() else []
    return rows[-1]["step"] if rows else 0


def rank_pid(rdir: Path, rank: int) -> int:
    """Rank `rank`'s process as the run's newest start recorded it (every sandbox node is this machine)."""
    def pid() -> int | None:
        starts = select(read_events(rdir / "events.jsonl"), Start)
        pids = starts[-1].details.pids if starts else None
        return pids[rank] if pids and len(pids) > rank and Path(f"/proc/{pids[rank]}").exists() else None
    return wait(pid, 60, f"rank {rank}'s process in {rdir}")


def job_state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True,
                         timeout=30).stdout
    m = re.search(r"\bJobState=(\S+)", out)
    return m.group(1) if m else "GONE"


def wait(probe: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    sys.exit(f"bench/restart.py: timed out waiting for {what}")


if __name__ == "__main__":
    sys.exit(main())
