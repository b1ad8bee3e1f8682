"""Scans against per-node kernel-log files, the way the local test cluster wires them: each node
has its own file, appended to during a job; the Prolog records where it stood, the Epilog judges
only what came after."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from xid_corpus import CODE_LINES

from resilient_slurm.health.log_sources import Cursor
from resilient_slurm.health.scan import (
    ScanRequest,
    choose_start,
    context_from_env,
    node_from_env,
    preflight,
    restart_count_from_env,
    run_scan,
)
from resilient_slurm.health.xid_catalog import Action

NOW = 1_800_000_000.0
NOISE = "[ 12.000000] EXT4-fs (vda): mounted filesystem r/w without journal.\n"


class Node:
    """One node: its kernel-log file and the Prolog/Epilog scans Slurm would run on it."""

    def __init__(self, tmp_path: Path, name: str = "n1") -> None:
        self.name, self.state_dir = name, str(tmp_path / "state")
        self.log = tmp_path / f"{name}.log"
        self.log.write_text(NOISE)

    def append(self, *lines: str) -> None:
        with self.log.open("a") as f:
            f.writelines(line + "\n" for line in lines)

    def scan(self, context: str, job: str | None = "42", restart: int = 0, now: float = NOW, **kw):
        request = ScanRequest(
            context, self.name, job_id=job, restart_count=restart, kernel_log=str(self.log),
            state_dir=self.state_dir, use_nvml=False, **kw,
        )  # fmt: skip
        return run_scan(request, now)


XID79, XID13, XID63 = CODE_LINES[79][0], CODE_LINES[13][0], CODE_LINES[63][0]


@pytest.mark.parametrize(
    ("context", "node", "run", "whole", "expected"),
    [
        ("prolog", "N", "R", False, "N"),
        ("epilog", "N", "R", False, "R"),
        ("epilog", "N", None, False, "N"),
        ("epilog", None, None, False, None),
        ("preflight", "N", "R", False, "N"),
        ("manual", "N", None, False, "N"),
        ("manual", "N", None, True, None),
    ],
)
def test_choose_start(context: str, node: str | None, run: str | None, whole: bool, expected: str | None) -> None:
    cursors = {"N": Cursor("file", "f", 1), "R": Cursor("file", "f", 2), None: None}
    assert choose_start(context, cursors[node], cursors[run], whole) is cursors[expected]


def test_epilog_judges_only_lines_after_its_prolog(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.append(XID79)  # logged before this job: the first Prolog judges it
    first = node.scan("prolog")
    assert first.verdict.action is Action.DRAIN
    node.append(NOISE.strip(), XID13)
    during = node.scan("epilog")
    assert [e.xid for e in during.events] == [13] and during.verdict.action is Action.RESTART_APP
    assert node.scan("prolog", job="43").events == ()  # nothing is judged twice


def test_a_fault_during_the_job_takes_the_node_out_in_the_epilog(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert node.scan("prolog").verdict.ok
    node.append(XID79)
    report = node.scan("epilog")
    assert not report.verdict.ok and report.verdict.xid == 79


def test_a_requeued_run_never_starts_from_an_earlier_runs_prolog(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.scan("prolog", restart=0)  # run 0 of job 42 starts here; its Epilog never runs here
    node.append(XID79)  # run 0's fault, judged by the next job's scans
    node.scan("prolog", job="77")
    node.scan("epilog", job="77")
    node.append(XID13)
    # Run 1 of job 42 had its Prolog on another node; its Epilog runs here too. Run 0's stale
    # start must not make it judge the 79 again.
    report = node.scan("epilog", restart=1)
    assert [e.xid for e in report.events] == [13]


def test_epilog_without_prolog_on_this_node_uses_the_node_cursor(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.scan("prolog", restart=0)
    node.append(XID79)
    node.scan("epilog", restart=0)  # run 0 ends: node out, cursor past the 79
    node.append(XID13)
    report = node.scan("epilog", restart=1)  # run 1's Prolog ran on another node only
    assert [e.xid for e in report.events] == [13]


def test_nodes_on_one_machine_keep_their_own_cursors(tmp_path: Path) -> None:
    n1, n2 = Node(tmp_path, "n1"), Node(tmp_path, "n2")
    n1.scan("prolog")
    n2.scan("prolog")
    n2.append(XID79)
    assert n1.scan("epilog").verdict.ok
    assert not n2.scan("epilog").verdict.ok


def test_application_xid_repeat_on_the_same_gpu_in_another_job(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.scan("prolog", job="1")
    node.append(XID13)
    assert node.scan("epilog", job="1").verdict.action is Action.RESTART_APP
    node.scan("prolog", job="1", restart=1)  # the same job, requeued: its own bug again
    node.append(XID13)
    assert node.scan("epilog", job="1", restart=1).verdict.action is Action.RESTART_APP
    node.scan("prolog", job="2")
    node.append(XID13)
    report = node.scan("epilog", job="2", now=NOW + 3600)
    assert report.verdict.action is Action.EXCLUDE and "same GPU in job 1" in report.verdict.reason


def test_benign_63_alone_keeps_the_node(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.scan("prolog")
    node.append(XID63)
    assert node.scan("epilog").verdict.action is Action.KEEP


def test_a_look_by_hand_moves_no_cursor(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.scan("prolog")
    node.append(XID79)
    assert not node.scan("manual", job=None).verdict.ok  # by hand with a file: the whole file
    assert not node.scan("epilog").verdict.ok  # the Epilog still sees the 79


def test_without_state_the_whole_log_is_judged_every_time(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.append(XID79)
    node.state_dir = None  # type: ignore[assignment]
    assert not node.scan("epilog").verdict.ok
    assert not node.scan("epilog").verdict.ok


def test_an_unreadable_log_fails_the_scan_except_in_preflight(tmp_path: Path) -> None:
    request = ScanRequest("epilog", "n1", kernel_log=str(tmp_path / "missing.log"), use_nvml=False)
    with pytest.raises(Exception, match="cannot open kernel log"):
        run_scan(request, NOW)
    report = preflight(state_dir=None, kernel_log=str(tmp_path / "missing.log"), environ={"SLURM_JOB_ID": "5"})
    assert report.verdict.ok and report.read is None
    assert report.notes[0].startswith("kernel log skipped: cannot open kernel log")
    assert report.notes[1] == "NVML checks skipped: NVML Shared Library Not Found"  # real NVML, no GPU here


def test_preflight_refuses_a_node_with_a_fault_and_counts_only_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text(XID79 + "\n")
    env = {"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "n4", "SLURM_RESTART_COUNT": "2"}
    first = preflight(state_dir=str(tmp_path / "s"), kernel_log=str(log), environ=env, now=NOW)
    assert not first.verdict.ok and first.verdict.xid == 79
    assert (tmp_path / "s" / "n4" / "cursor.json").exists()
    again = preflight(state_dir=str(tmp_path / "s"), kernel_log=str(log), environ=env, now=NOW)
    assert again.verdict.ok


def test_preflight_expecting_gpus_without_nvml_refuses_the_node(tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text("")
    report = preflight(state_dir=None, expected_gpus=8, kernel_log=str(log), environ={})
    assert report.verdict.action is Action.DRAIN
    assert report.verdict.reason == "check_gpu_count: NVML unavailable, 8 GPUs expected"


def test_a_hung_preflight_is_a_failure_never_a_pass(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    try:
        report = preflight(state_dir=None, kernel_log=str(fifo), timeout_s=0.5, environ={})
        assert not report.verdict.ok
        assert report.verdict.reason == f"preflight: did not finish within 0.5 s while reading the kernel log ({fifo})"
    finally:
        # Release the scan thread still blocked opening the FIFO.
        threading.Thread(target=lambda: os.close(os.open(fifo, os.O_WRONLY)), daemon=True).start()


def test_a_broken_preflight_setup_raises_instead_of_blaming_the_node(tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text("")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(OSError):
        preflight(state_dir=str(blocker), kernel_log=str(log), environ={"SLURMD_NODENAME": "n1"})


def test_slurm_environment() -> None:
    prolog = {
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_ID": "5",
        "SLURM_JOB_RESTART_COUNT": "3",
    }
    assert (context_from_env(prolog), node_from_env(prolog), restart_count_from_env(prolog)) == ("prolog", "n2", 3)
    assert context_from_env({"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}) == "epilog"
    assert context_from_env({"SLURM_JOB_ID": "5"}) == "preflight"
    assert context_from_env({}) == "manual"
    assert restart_count_from_env({"SLURM_RESTART_COUNT": "1"}) == 1
    assert restart_count_from_env({"SLURM_JOB_RESTART_COUNT": "x"}) == 0
    assert node_from_env({}) == os.uname().nodename.split(".")[0]
    with pytest.raises(ValueError, match="context 'job' is not one of"):
        ScanRequest("job", "n1")
