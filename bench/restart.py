"""How fast a run gets going again after it loses a node: inside its allocation (a spare node) vs
through the queue (a requeue), on the local Slurm sandbox.

    tools/slurm_sandbox up; source /tmp/resilient_slurm_sandbox/env
    python bench/restart.py [--repeats 2] [--tracking disabled|offline]

The same tiny run (2 nodes x 1 rank, 200 steps, a checkpoint every 25) is submitted in turn with
`cluster.spare_nodes=1` (the driver restarts it on the spare) and without (the task requeues the
job, as before the driver existed), alternating, `--repeats` times each. At step 60 the bench
SIGKILLs rank 1's process, which is what a node that dies looks like from the job: the process
is gone without a trace. It prints, per run and as medians per path:
- failure -> new process: the kill to the first process of the next attempt (its `start` event's
  process_started) ;
- failure -> first step: the kill to the next attempt's first metrics row;
- the same two from the ledger alone (the report's figures: the failure as the driver or the
  ledger's last trace saw it);
- steps lost and goodput (the report's accounting: productive / allocated time, where the gap of a
  restart inside the allocation is held, so allocated, and a requeue's wait is not), and
  productive / wall time, which charges the requeue's wait too.
The bench's own clock of the kill is the failure's true time; both sides read one clock (all the
sandbox's nodes are this machine).

For the simulator (`python -m resilient_slurm.simulate --from-bench FILE`, issue 23), the JSON this
bench writes carries these keys (all listed, with their meanings, in resilient_slurm/simulate/bench.py;
medians, seconds unless named otherwise):
    ranks                 world size of the runs
    steady_step_s         a training step's median time in them
    heartbeat_timeout_s   monitor.heartbeat_timeout_s of the hang runs
    heartbeat_detect_s    SIGSTOP of one rank -> the monitor's hang decision
    collective_timeout_s  cluster.collective_timeout_s of the hang runs
    collective_detect_s   the same hang found by the collective timeout
    crash_detect_s        SIGKILL of one rank -> the driver's decision
    <path>_<part>_s       each restart's breakdown as its restart event records it, for path inprocess,
                          step or requeue, and part detect, teardown, placement, process_start,
                          rendezvous, load, data_ready, first_step (first_step: its start to its end)
    <path>_restart_s      failure -> the first step's end
    <path>_load_source    memory, buddy, hot or cold
The simulator takes in_alloc_restart_s and restart_s from the step and requeue breakdowns (less
detect, load and one steady step), and the in-process restart's costs from the inprocess one.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resilient_slurm.analysis.goodput import account  # noqa: E402
from resilient_slurm.rundir.metrics import lost_path, read_metrics  # noqa: E402
from resilient_slurm.files import stamp_seconds  # noqa: E402
from resilient_slurm.ledger import Start, read_events, select  # noqa: E402

TINY = ["+experiment=tiny_sft", "model.hidden_size=64", "model.intermediate_size=160", "model.num_layers=2",
        "model.num_heads=4", "model.num_kv_heads=2", "data.seq_len=64", "data.global_batch_size=4",
        "data.micro_batch_size=2", "optim.warmup_steps=10", "train.log_every_steps=50", "train.max_steps=200",
        "checkpoint.every_steps=25", "eval.every_steps=0", "train.threads=1", "cluster=slurm", "cluster.nodes=2",
        "cluster.tasks_per_node=1", "cluster.collective_timeout_s=60", "cluster.time_min=10",
        "fault.step_sleep_s=0.05"]
PATHS = {"in allocation": ["cluster.spare_nodes=1"], "requeue": []}
KILL_AT_STEP = 60
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tracking", default="disabled", help="tracking.mode of the runs (offline adds wandb's "
                                                                "start-up to every start, on both paths)")
    args = parser.parse_args()
    if "SLURM_CONF" not in os.environ:
        sys.exit("bench/restart.py: no SLURM_CONF; run tools/slurm_sandbox up and source its env file")
    root = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    rows: list[tuple[str, dict[str, float | None]]] = []
    load = os.getloadavg()[0]
    for i in range(args.repeats):
        order = list(PATHS) if i % 2 == 0 else list(reversed(PATHS))
        for path in order:
            name = f"{path.replace(' ', '-')}-{i}"
            rows.append((path, one_run(root, name, PATHS[path] + [f"tracking.mode={args.tracking}"])))
            print(f"  {name}: {fmt(rows[-1][1])}", flush=True)
    print(f"\nload average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (2 cores, shared); "
          f"tracking.mode={args.tracking}; runs under {root}\n")
    table(rows)


def one_run(root: Path, name: str, extra: list[str]) -> dict[str, float | None]:
    done = subprocess.run([sys.executable, "-m", "resilient_slurm.launch", *TINY, f"run.root={root}",
                           f"run.name={name}", *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode:
        sys.exit(f"bench/restart.py: launch failed:\n{done.stdout}{done.stderr}")
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)  # type: ignore[union-attr]
    rdir = root / "tiny_sft" / name
    wait(lambda: last_step(rdir) >= KILL_AT_STEP, 300, f"step {KILL_AT_STEP} of {name}")
    pid = wait(lambda: rank_pid(job, 1), 60, f"rank 1 of job {job}")
    killed_at = time.time()
    os.kill(pid, 9)
    wait(lambda: job_state(job) in FINISHED, 600, f"job {job} to end")
    events = read_events(rdir / "events.jsonl")
    kept = read_metrics(rdir / "metrics.jsonl")
    acc = account(events, kept, read_metrics(lost_path(rdir / "metrics.jsonl")))
    if len(acc.attempts) < 2 or not acc.finished:
        sys.exit(f"bench/restart.py: {name} did not restart and finish: {[a.outcome for a in acc.attempts]}")
    second = acc.attempts[1]
    started = [stamp_seconds(s.details.process_started) for s in select(events, Start)
               if s.details.process_started and stamp_seconds(s.details.process_started) > killed_at]
    restart = acc.restart_list[0]
    return {
        "process_s": min(started) - killed_at if started else None,
        "first_step_s": None if second.first_step_s is None else second.first_step_s - killed_at,
        "ledger_process_s": restart.process_s, "ledger_first_step_s": restart.first_step_s,
        "steps_lost": float(acc.steps_lost), "goodput": acc.time.goodput,
        "wall_goodput": acc.time.productive_s / (acc.attempts[-1].end_s - acc.attempts[0].begin_s),
        "in_allocation": float(restart.in_allocation),
    }


def table(rows: list[tuple[str, dict[str, float | None]]]) -> None:
    keys = [("failure -> new process", "process_s", "s"), ("failure -> first step", "first_step_s", "s"),
            ("  (ledger) -> new process", "ledger_process_s", "s"), ("  (ledger) -> first step", "ledger_first_step_s", "s"),
            ("steps lost", "steps_lost", ""), ("goodput (of allocated)", "goodput", "%"),
            ("productive / wall time", "wall_goodput", "%")]
    print(f"{'median of ' + str(sum(p == 'requeue' for p, _ in rows)) + ' runs each':<28}"
          + "".join(f"{p:>16}" for p in PATHS) + f"{'ratio':>10}")
    for label, key, unit in keys:
        medians = []
        for path in PATHS:
            values = [r[key] for p, r in rows if p == path and r[key] is not None]
            medians.append(statistics.median(values) if values else None)
        cells = [cell(m, unit) for m in medians]
        ratio = f"{medians[0] / medians[1]:.2f}" if None not in medians and medians[1] else "-"
        print(f"{label:<28}" + "".join(f"{c:>16}" for c in cells) + f"{ratio:>10}")


def cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if unit == "%" else f"{value:.1f}{unit}"


def fmt(r: dict[str, float | None]) -> str:
    return (f"new process {cell(r['process_s'], 's')}, first step {cell(r['first_step_s'], 's')}, "
            f"steps lost {cell(r['steps_lost'], '')}, goodput {cell(r['goodput'], '%')}")


def last_step(rdir: Path) -> int:
    rows = read_metrics(rdir / "metrics.jsonl") if (rdir / "metrics.jsonl").exists() else []
    return rows[-1]["step"] if rows else 0


def rank_pid(job: str, procid: int) -> int | None:
    """The training process of rank `procid` (every sandbox node is this machine)."""
    want = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_PROCID={procid}".encode()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not Path(argv[0].decode()).name.startswith("python"):
                continue
            if b"resilient_slurm.supervise.task" not in argv and b"submitit.core._submit" not in argv:
                continue
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env and b"SLURM_STEP_ID=batch" not in env:
            return int(proc.name)
    return None


def job_state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True,
                         timeout=30).stdout
    m = re.search(r"\bJobState=(\S+)", out)
    return m.group(1) if m else "GONE"


def wait(probe, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    sys.exit(f"bench/restart.py: timed out waiting for {what}")


if __name__ == "__main__":
    main()
