"""`tools/xid_scan` end to end, as a subprocess, the way Slurm runs it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xid_corpus import CODE_LINES

REPO = Path(__file__).resolve().parents[3]
TOOL = REPO / "tools" / "xid_scan"
HEALTH = REPO / "resilient_slurm" / "health"
XID79, XID13, XID63 = CODE_LINES[79][0], CODE_LINES[13][0], CODE_LINES[63][0]


def xid_scan(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def slurm_env(context: str, node: str = "n1", job: str = "42", restart: int = 0) -> dict[str, str]:
    """What slurmd gives a Prolog/Epilog (no PATH at all)."""
    return {
        "SLURM_SCRIPT_CONTEXT": f"{context}_slurmd",
        "SLURMD_NODENAME": node,
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_JOB_RESTART_COUNT": str(restart),
        "SLURM_CLUSTER_NAME": "local",
    }


def write(path: Path, *lines: str) -> Path:
    with path.open("a") as f:
        f.writelines(line + "\n" for line in lines)
    return path


def test_by_hand_a_healthy_file_passes(tmp_path: Path) -> None:
    log = write(tmp_path / "k.log", "[ 1.0] EXT4-fs (vda): mounted", XID63)
    done = xid_scan("--kernel-log", str(log), "--no-nvml", "--node", "n1")
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        "xid_scan n1: ok (keep): check_xid: Xid 63 INFOROM_DRAM_RETIREMENT_EVENT on 0000:10:1c x1: "
        "Row Remapper: New row marked for remapping, reset gpu to activate."
    ]


def test_by_hand_a_fatal_xid_fails_with_one_line(tmp_path: Path) -> None:
    log = write(tmp_path / "k.log", XID13, XID79)
    done = xid_scan("--kernel-log", str(log), "--node", "n1")
    assert done.returncode == 1
    [line] = done.stdout.splitlines()
    assert line.startswith("xid_scan n1: node out (drain): check_xid: Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on 0000:05:00")
    assert line.endswith("(+1 more)")
    assert "NVML checks skipped: NVML Shared Library Not Found" in done.stderr  # no GPU on this machine


def test_unreadable_log_and_bad_config_have_their_own_exit_codes(tmp_path: Path) -> None:
    missing = xid_scan("--kernel-log", str(tmp_path / "none.log"), "--node", "n1", "--no-nvml")
    assert missing.returncode == 3
    assert (
        missing.stdout
        == f"xid_scan n1: scan failed: cannot open kernel log {tmp_path}/none.log: No such file or directory\n"
    )
    bad = tmp_path / "over.json"
    bad.write_text('{"63": "reboot"}')
    usage = xid_scan("--kernel-log", str(tmp_path / "none.log"), "--catalog-overrides", str(bad), "--node", "n1")
    assert usage.returncode == 2 and "unknown action 'reboot'" in usage.stdout
    assert xid_scan("--bogus").returncode == 2
    log = write(tmp_path / "k.log", XID79)
    name = xid_scan("--kernel-log", str(log), "--state-dir", str(tmp_path), "--node", "../etc", "--no-nvml")
    assert name.returncode == 2 and name.stdout.splitlines() == [
        "xid_scan ../etc: usage: node name '../etc' is not a Slurm node name (letters, digits, '.', '_', '-')"
    ]


@pytest.mark.parametrize(
    ("name", "text"), [("over.json", '{"63": "reset-gpu"}'), ("over.ini", "[xid]\n63 = reset-gpu\n")]
)
def test_site_overrides_of_the_catalog(tmp_path: Path, name: str, text: str) -> None:
    log = write(tmp_path / "k.log", XID63)
    (tmp_path / name).write_text(text)
    done = xid_scan("--kernel-log", str(log), "--catalog-overrides", str(tmp_path / name), "--no-nvml")
    assert done.returncode == 1 and "(reset-gpu)" in done.stdout


def test_prolog_then_epilog_in_a_bare_environment(tmp_path: Path) -> None:
    """The executable itself (its shebang, no PATH) as slurmd runs it; the node's log file grows
    during the job and only the growth counts."""
    log = write(tmp_path / "n1.log", XID79)  # an old fault, before the state existed
    state, excl = tmp_path / "state", tmp_path / "exclude.json"
    flags = ["--kernel-log", str(log), "--state-dir", str(state), "--exclude-file", str(excl)]

    def run(context: str, job: str = "42", restart: int = 0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TOOL), *flags],
            capture_output=True,
            text=True,
            timeout=30,
            env=slurm_env(context, job=job, restart=restart),
        )

    first = run("prolog")
    assert first.returncode == 1 and "Xid 79" in first.stdout  # judged once ...
    assert json.loads(excl.read_text())["nodes"]["n1"]["xid"] == 79
    assert run("prolog", job="43").returncode == 0  # ... and never again
    write(log, XID13)
    epilog = run("epilog", job="43")
    assert epilog.returncode == 0 and "(restart-app)" in epilog.stdout
    assert run("prolog", job="44").returncode == 0
    write(log, XID13)  # the same GPU faults again, in another job: exclude
    repeat = run("epilog", job="44")
    assert repeat.returncode == 1 and "same GPU in job 43" in repeat.stdout
    assert json.loads(excl.read_text())["nodes"]["n1"]["job_id"] == "44"
    assert len(repeat.stdout.splitlines()) == 1


def test_drain_runs_scontrol_with_the_reason(tmp_path: Path) -> None:
    # Checks the argv contract only; the real drain is exercised on the local Slurm cluster by
    # the acceptance test, which this unit suite does not start.
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    fake.chmod(0o755)
    log = write(tmp_path / "k.log", XID79)
    done = xid_scan(
        "--kernel-log", str(log), "--drain", "--scontrol", str(fake), "--no-nvml", env=slurm_env("epilog", "n7")
    )
    assert done.returncode == 1
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:3] == ["update", "nodename=n7", "state=drain"]
    assert argv[3].startswith("reason=xid_scan: check_xid: Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS")


def test_a_failed_drain_is_a_note_and_the_exit_code_still_takes_the_node_out(tmp_path: Path) -> None:
    log = write(tmp_path / "k.log", XID79)
    done = xid_scan(
        "--kernel-log", str(log), "--drain", "--scontrol", str(tmp_path / "none"), "--no-nvml", "--node", "n1"
    )
    assert done.returncode == 1
    assert f"drain failed: cannot run {tmp_path}/none" in done.stderr


@pytest.mark.parametrize("writer_open", [False, True], ids=["fifo-without-writer", "fifo-silent-writer"])
def test_a_hung_read_fails_within_the_watchdog_bound(tmp_path: Path, writer_open: bool) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR) if writer_open else None  # O_RDWR: open without blocking
    try:
        # The watchdog's own line says it fired (not the test's 20 s limit): no clock bound needed here.
        done = xid_scan("--kernel-log", str(fifo), "--timeout-s", "1", "--no-nvml", "--node", "n1", timeout=20)
    finally:
        if writer is not None:
            os.close(writer)
    assert done.returncode == 3
    assert (
        done.stdout == f"xid_scan n1: scan failed: watchdog expired after 1 s while reading the kernel log ({fifo})\n"
    )


def test_exclude_subcommands(tmp_path: Path) -> None:
    excl = str(tmp_path / "exclude.json")
    add = xid_scan(
        "exclude", "add", "n3", "--file", excl, "--reason", "Xid 79", "--xid", "79", "--job-id", "42", "--ttl-h", "1"
    )
    assert add.returncode == 0 and add.stdout.startswith("excluded n3 until ")
    assert xid_scan("exclude", "add", "n1", "--file", excl, "--reason", "manual").returncode == 0
    listed = xid_scan("exclude", "list", "--file", excl).stdout.splitlines()
    assert [row.split("\t")[0] for row in listed] == ["n1", "n3"]
    assert listed[1].split("\t")[2:] == ["xid 79", "job 42", "Xid 79"]
    assert xid_scan("exclude", "render", "--file", excl).stdout == "n1,n3\n"
    assert xid_scan("exclude", "clear", "n3", "--file", excl).stdout == "cleared n3\n"
    assert xid_scan("exclude", "render", "--file", excl).stdout == "n1\n"
    assert xid_scan("exclude", "clear", "--file", excl).stdout == "cleared n1\n"
    assert xid_scan("exclude", "render", "--file", excl).stdout == "\n"
    bad = xid_scan("exclude", "add", "n1,n2", "--file", excl, "--reason", "r")
    assert bad.returncode == 2 and "not a Slurm node name" in bad.stderr
    assert xid_scan("exclude", "list").returncode == 2  # --file is required


def test_health_imports_only_the_standard_library() -> None:
    modules = sorted(p.stem for p in HEALTH.glob("*.py"))
    probe = (
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nbefore = set(sys.modules)\n"
        + "".join(f"import resilient_slurm.health.{m}\n" for m in modules)
        + "new = {n.split('.')[0] for n in set(sys.modules) - before}\n"
        "print(','.join(sorted(new - set(sys.stdlib_module_names) - {'resilient_slurm'})))\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("path", [*sorted(HEALTH.glob("*.py")), TOOL], ids=lambda p: p.name)
def test_valid_python_3_10(path: Path) -> None:
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_the_scan_marks_a_node_it_takes_out_and_the_node_record_prints_and_clears(tmp_path: Path) -> None:
    record = str(tmp_path / "nodes.jsonl")
    log = write(tmp_path / "k.log", XID79)
    for job in ("41", "42"):  # the Epilog of two jobs, each finding the node's fatal Xid
        out = xid_scan("--kernel-log", str(log), "--node", "n3", "--job-id", job, "--no-nvml",
                       "--append-node-record", record)
        assert out.returncode == 1
    assert xid_scan("--kernel-log", str(write(tmp_path / "ok.log")), "--node", "n1", "--no-nvml",
                    "--append-node-record", record).returncode == 0  # a node that stays is not marked
    printed = xid_scan("--node-record", record)
    assert printed.returncode == 0
    (row,) = printed.stdout.splitlines()
    node, counts, newest, verdict = row.split("\t")
    assert (node, counts) == ("n3", "xid 2 sdc 0 straggler 0 hang 0") and newest.endswith("xid (job 42)")
    assert verdict == "OUT: node record: 2 xid in 7.0 days"
    assert xid_scan("--node-record", record, "--policy", "xid=3").stdout.endswith("\tin\n")
    cleared = xid_scan("--node-record", record, "--clear", "n3")
    assert cleared.stdout.splitlines()[0].split("\t")[1:4:2] == ["xid 0 sdc 0 straggler 0 hang 0", "in"]
    bad = xid_scan("--node-record", record, "--policy", "xid")
    assert bad.returncode == 2 and bad.stderr.startswith("xid_scan --node-record: policy part 'xid'")
