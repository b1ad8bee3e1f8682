"""The report's figures from a ledger and metrics written here, step by step: a run stopped by
SIGUSR1, then killed after its step-75 checkpoint, then finished. Golden file for the summary."""

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from resilient_slurm.analysis.goodput import account, cause_label, split_attempts
from resilient_slurm.analysis.report import load, main, render, render_side_by_side, summarize
from resilient_slurm.config import Config
from resilient_slurm.ledger import Save, parse, select

GOLDEN = Path(__file__).parent / "golden" / "report_summary.txt"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc).timestamp()
STEP_S, EVAL_S, SAVE_S = 0.5, 1.0, 0.25


def stamp(s: float) -> str:
    return datetime.fromtimestamp(T0 + s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def synthetic_run(run_dir: Path) -> None:
    """Attempt 1: 0 -> 40, SIGUSR1. Attempt 2: 40 -> 90, killed after saving 75. Attempt 3: 75 -> 100."""
    events, kept, lost = [], [], []

    def ev(t, kind, step, **kw):
        events.append({"time": stamp(t), "event": kind, "step": step, "rank": 0, **kw})

    def steps(t, first, last, rows, save_every=25):
        for step in range(first, last + 1):
            t += STEP_S
            row = {"step": step, "loss": 5.0 - step / 50, "step_seconds": STEP_S}
            if step % 50 == 0:
                t += EVAL_S
                row.update(val_loss=5.1 - step / 50, exact_match=step / 200, eval_seconds=EVAL_S)
            rows.append({**row, "time": stamp(t)})
            if step % save_every == 0:
                t += SAVE_S
                ev(t, "save", step, reason="periodic", path=f"/ckpt/step_{step:08d}", seconds=SAVE_S)
        return t

    ev(0, "start", 0, process_started=stamp(-3))
    t = steps(0, 1, 40, kept)
    ev(t + 0.1, "signal", 40, signal="SIGUSR1")
    ev(t + 0.2, "save", 40, reason="emergency", path="/ckpt/step_00000040", seconds=0.1)
    ev(t + 0.3, "stop", 40, reason="stop requested")
    ev(100, "start", 0, process_started=stamp(97))
    ev(101, "resume", 40, checkpoint="/ckpt/step_00000040")
    t = steps(101, 41, 75, kept)
    steps(t, 76, 90, lost)  # killed at 90: these steps are redone by the next attempt
    ev(200, "start", 0, process_started=stamp(196))
    ev(201, "resume", 75, checkpoint="/ckpt/step_00000075")
    t = steps(201, 76, 100, kept)
    ev(t + 0.5, "save", 100, reason="final", path="/ckpt/step_00000100", seconds=SAVE_S)
    ev(t + 0.6, "finish", 100)

    run_dir.mkdir(parents=True)
    cfg = Config()
    cfg.train.max_steps = 100
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    (run_dir / "run.json").write_text(json.dumps({"run_id": "abc123def456", "name": "demo", "experiment": "exp",
                                                  "created": stamp(-5), "config_hash": "0" * 16}))
    for name, lines in (("events.jsonl", events), ("metrics.jsonl", kept), ("metrics-lost.jsonl", lost)):
        (run_dir / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    attempt = {"kind": "attempt", "time": stamp(0), "attempt": 1, "job_id": None, "nodes": ["node1"],
               "git": {"commit": "f" * 40, "branch": "main", "dirty": True, "diff": "git/ffffffffffff-1234abcd.diff"},
               "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None}}
    (run_dir / "record.jsonl").write_text(json.dumps(attempt) + "\n")


def test_summary_matches_the_golden_file(tmp_path):
    run_dir = tmp_path / "demo"
    synthetic_run(run_dir)
    text = render(summarize(load(run_dir))).replace(str(run_dir), "<RUN>")
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_the_figures_follow_from_the_definitions(tmp_path):
    run_dir = tmp_path / "demo"
    synthetic_run(run_dir)
    files = load(run_dir)
    acc = account(files.events, files.kept, files.lost)
    assert [(a.resumed_from, a.last_step, a.outcome) for a in acc.attempts] == [
        (0, 40, "stopped by SIGUSR1"), (40, 90, "killed without a trace"), (75, 100, "finished")]
    assert acc.restarts_by_cause == {"stopped (SIGUSR1)": 1, "killed": 1}
    assert acc.steps_lost == 15 and acc.steps_done == 100 and acc.finished
    t = acc.time
    assert t.productive_s == pytest.approx(100 * STEP_S) and t.redone_s == pytest.approx(15 * STEP_S)
    assert t.eval_s == pytest.approx(2 * EVAL_S)  # at steps 50 and 100
    saves = select(files.events, Save)
    assert t.save_s == pytest.approx(sum(e.details.seconds for e in saves))
    first = acc.attempts[0]
    assert first.begin_s == pytest.approx(T0 - 3)  # the process start counts as allocated
    assert t.allocated_s == pytest.approx(sum(a.end_s - a.begin_s for a in acc.attempts))
    assert t.goodput == pytest.approx(t.productive_s / t.allocated_s)
    assert t.waiting_s == pytest.approx(sum(b.begin_s - a.end_s for a, b in zip(acc.attempts, acc.attempts[1:])))
    assert acc.last_checkpoint == {"step": 100, "path": "/ckpt/step_00000100", "reason": "final"}
    assert acc.marks.rollbacks == [(75, 90)] and acc.marks.faults == [(90, "killed without a trace")]


@pytest.mark.parametrize(
    "kinds, attempts",
    [
        ([], 0),
        (["submitted", "start", "save", "stop"], 1),  # before the first attempt: not part of one
        (["start", "save", "start", "resume"], 2),
        (["attempt", "start", "save", "attempt", "start", "crash"], 2),  # Slurm: attempt, then start
        (["start", "rank_exit", "start"], 2),
    ],
)
def test_split_attempts(kinds, attempts):
    events = [parse({"event": k, "time": stamp(i), "step": 0}) for i, k in enumerate(kinds)]
    assert len(split_attempts(events)) == attempts


@pytest.mark.parametrize(
    "outcome, label",
    [
        ("stopped by SIGUSR1", "stopped (SIGUSR1)"),
        ("stopped by a stop request", "stopped (a stop request)"),
        ("crashed: InjectedFault: injected failure at step 7", "crashed (InjectedFault)"),
        ("killed without a trace", "killed"),
        ("gave up: 4 consecutive failures", "gave up"),
    ],
)
def test_cause_label(outcome, label):
    assert cause_label(outcome) == label


def test_several_runs_side_by_side_and_a_bad_path(tmp_path, capsys):
    synthetic_run(tmp_path / "a")
    synthetic_run(tmp_path / "b")
    text = render_side_by_side([summarize(load(tmp_path / "a")), summarize(load(tmp_path / "b"))])
    lines = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.split()[0] != "steps"}
    assert lines["run"] == ["demo", "demo"] and lines["restarts"] == ["2", "2"]
    assert lines["goodput"] == ["68.1%", "68.1%"] and lines["checkpoint"] == ["100", "100"]
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "report.png").stat().st_size > 10_000
    assert main([str(tmp_path / "nothing-here")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def job_seven():
    """Job 7's ledger and metrics, written here: `ev(t, kind, step, ...)` adds an event at T0 + t,
    `steps(t, first, last)` a metrics row per step of STEP_S from t, and returns the time after them."""
    events, kept = [], []

    def ev(t, kind, step, restart=0, job_step=0, rank=0, **kw):
        events.append(parse({"time": stamp(t), "event": kind, "step": step, "rank": rank, "job_id": "7",
                             "restart": restart, "job_step": job_step, **kw}))

    def steps(t, first, last):
        for step in range(first, last + 1):
            t += STEP_S
            kept.append({"step": step, "loss": 1.0, "step_seconds": STEP_S, "time": stamp(t)})
        return t

    return events, kept, ev, steps


def test_restarts_inside_the_allocation_are_counted_apart_with_their_latencies_and_their_gap_is_held_time():
    """Job 7 loses a node at step 30 (the driver restarts on the spare), then is requeued at step 60."""
    events, kept, ev, steps = job_seven()
    ev(0, "attempt", None, nodes=["n1", "n2"], ntasks=2, cause="first start")
    ev(1, "start", 0, process_started=stamp(-4))
    t = steps(1, 1, 30)  # ends at 16.0
    ev(t + 0.5, "crash", 30, rank=1, node="n2", error="TaskLost: task 1 on n2 ended without a trace (Killed)", traceback="")
    ev(t + 2.0, "attempt", None, job_step=1, nodes=["n1", "n3"], ntasks=2, cause="crashed at step 30")
    ev(t + 3.0, "start", 0, job_step=1, process_started=stamp(t + 1.0))
    ev(t + 3.1, "resume", 25, job_step=1, checkpoint="/c/step_00000025")
    t2 = steps(t + 3.5, 26, 60)
    parts = {"detect": 0.05, "teardown": 0.2, "placement": 0.1, "process_start": 0.6, "rendezvous": 0.3, "load": 0.4,
             "data_ready": None, "first_step": 1.5, "load_source": "memory"}
    ev(t + 4.0, "restart_in_allocation", 30, job_step=1, rank=-1, cause="failed after saving progress", move="spare",
       placement="n2 replaced by spare n3", replaced=["n2"], added=["n3"], failed_at=stamp(t + 0.25),
       path="inprocess", breakdown=parts)
    ev(t2 + 0.1, "requeue", 60, job_step=1, reason="SIGUSR1: time-limit warning", ok=True)
    ev(t2 + 30, "attempt", None, restart=1, nodes=["n1", "n3"], ntasks=2, cause="SIGUSR1")
    ev(t2 + 31, "start", 0, restart=1, process_started=stamp(t2 + 29))
    ev(t2 + 31.5, "resume", 60, restart=1, checkpoint="/c/step_00000060")
    t3 = steps(t2 + 32, 61, 70)
    ev(t3 + 0.1, "finish", 70, restart=1)

    acc = account(events, kept, [])
    assert [a.in_allocation for a in acc.attempts] == [False, True, False]
    inside, requeued = acc.restart_list
    assert inside.in_allocation and inside.move == "spare" and not requeued.in_allocation
    assert inside.process_s == pytest.approx(0.75) and inside.first_step_s == pytest.approx(3.25 + STEP_S)
    assert requeued.process_s == pytest.approx(29 - 0.1) and requeued.first_step_s == pytest.approx(32.5 - 0.1)
    first, second, third = acc.attempts
    # the restart inside the allocation held the nodes: allocated, not waiting
    assert acc.time.held_between_s == pytest.approx(second.begin_s - first.end_s)
    assert acc.time.waiting_s == pytest.approx(third.begin_s - second.end_s)
    assert acc.time.allocated_s == pytest.approx(sum(a.duration_s for a in acc.attempts) + acc.time.held_between_s)
    from resilient_slurm.analysis.report import _restart_lines

    lines = _restart_lines(acc.restart_list)
    assert lines[0].split() == ["restarts", "in", "allocation", "1", "(1", "spare)"]
    assert lines[1].strip() == "failure -> new process / first step: 0.8s / 3.8s"
    assert lines[2].strip() == "requeued or relaunched 1 (1 killed)"  # no stop event: the ledger says no more
    assert lines[3].strip() == "failure -> new process / first step: 28.9s / 32.4s"
    # the restart inside the allocation, part by part; a part the ledger does not show is "-"
    assert inside.path == "inprocess" and inside.breakdown == parts
    head, row = lines[4].split(), lines[5].split()
    assert head[:3] == ["restart", "breakdown", "(s):"] and head[3:] == [
        "attempt", "path", "move", "detect", "teardown", "placement", "process_start", "rendezvous", "load",
        "data_ready", "first_step", "source", "total"]
    assert row == ["#2", "inprocess", "spare", "0.05", "0.20", "0.10", "0.60", "0.30", "0.40", "-", "1.50", "memory",
                   "3.8s"]
    assert len(lines) == 6  # the restart through the queue has no breakdown


def test_the_report_piped_into_head_ends_without_a_traceback(tmp_path):
    """`resilient-report RUN | head`: head has gone before the report writes (`-n 0` exits at once),
    so the write meets a closed pipe; the report ends quietly with status 0."""
    import subprocess
    import sys

    synthetic_run(tmp_path / "demo")
    done = subprocess.run(f"{sys.executable} -m resilient_slurm.report --no-png {tmp_path / 'demo'} | head -n 0; "
                          f"echo ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash", capture_output=True,
                          text=True, timeout=120)
    assert done.stdout == "0\n" and done.stderr == "", done.stderr


def test_a_restart_inside_the_surviving_processes_counts_the_allocation_once():
    """Rank 0's process goes on into the second generation, so that start names the process start
    of the first: the second attempt still begins where the first ended, and nothing is counted twice."""
    events, kept, ev, steps = job_seven()
    ev(0, "attempt", None, nodes=["n1", "n2"], ntasks=2, cause="first start")
    ev(1, "start", 0, process_started=stamp(-4))
    t = steps(1, 1, 30)
    ev(t + 0.5, "peer_lost", 30, error="Connection closed by peer", teardown_s=0.01, generation=1)
    ev(t + 1.5, "attempt", None, job_step=1, nodes=["n1", "n3"], ntasks=2, cause="crashed at step 30")
    ev(t + 2.0, "start", 0, job_step=1, process_started=stamp(-4))
    ev(t + 2.1, "resume", 25, job_step=1, checkpoint="/c/step_00000025")
    t2 = steps(t + 2.2, 26, 40)
    ev(t2 + 0.1, "finish", 40, job_step=1)

    acc = account(events, kept, [])
    first, second = acc.attempts
    assert second.in_allocation and second.begin_s == first.end_s
    assert acc.time.allocated_s == pytest.approx((T0 + t2 + 0.1) - (T0 - 4))  # the wall time, once
    assert acc.time.goodput == pytest.approx(acc.time.productive_s / acc.time.allocated_s)


def test_a_replica_group_lost_and_healed_is_one_attempt_its_short_steps_productive_and_degraded():
    """Job 7 with two replica groups: group 1 is lost after step 20; group 0 goes on alone (its steps
    twice as long) until group 1's replacement healed from it and joined at step 30."""
    events, kept, ev, steps = job_seven()
    ev(0, "attempt", None, nodes=["n1", "n2"], ntasks=2, cause="first start")
    ev(1, "start", 0, process_started=stamp(-4))
    t = steps(1, 1, 20)
    for step in range(21, 31):
        t += 2 * STEP_S
        kept.append({"step": step, "loss": 1.0, "step_seconds": 2 * STEP_S, "time": stamp(t), "replica_missing": 1})
    ev(12.0, "replica_leave", 20, group=1, live=[0], seconds=3.5)
    ev(18.0, "replica_heal", 29, rank=1, group=1, source=0, seconds=0.8, bytes=4096)
    ev(t + 0.1, "replica_join", 30, rank=1, group=1, live=[0, 1], seconds=12.5)
    t = steps(t, 31, 40)
    ev(t + 0.1, "finish", 40)

    acc = account(events, kept, [])
    assert len(acc.attempts) == 1 and acc.restarts == 0 and acc.finished and acc.steps_lost == 0
    assert acc.time.productive_s == pytest.approx(30 * STEP_S + 10 * 2 * STEP_S)
    assert acc.time.degraded_s == pytest.approx(10 * 2 * STEP_S) and acc.degraded_steps == 10
    assert [(c.kind, c.group, c.step, c.seconds) for c in acc.replica_changes] == [
        ("leave", 1, 20, 3.5), ("heal", 1, 29, 0.8), ("join", 1, 30, 12.5)]
    from resilient_slurm.analysis.report import _replica_lines

    assert [line.split(None, 1)[-1] if i == 0 else line.strip() for i, line in
            enumerate(_replica_lines(acc.replica_changes))] == [
        "group 1 leave at step 20 3.5s (groups [0] went on)",
        "group 1 heal at step 29 0.8s (from group 0, 4096 bytes)",
        "group 1 join at step 30 12.5s (process start -> first step)"]
