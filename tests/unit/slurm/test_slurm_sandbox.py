"""The pure parts of tools/slurm_sandbox: slurm.conf text, hook wrappers, sinfo parsing, readiness."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "slurm_sandbox"


def _load_script():
    # No .py suffix, so the default finders would not take it.
    loader = importlib.machinery.SourceFileLoader("slurm_sandbox", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


sandbox = _load_script()
DIR = "/tmp/sbx"


def conf_lines(nodes: int = 3) -> list[str]:
    return sandbox.render_slurm_conf(DIR, nodes).splitlines()


@pytest.mark.parametrize(
    "line",
    [
        "SlurmctldPort=6817",
        "StateSaveLocation=/tmp/sbx/state",
        "SlurmdSpoolDir=/tmp/sbx/spool/%n",
        "SlurmdPidFile=/tmp/sbx/slurmd-%n.pid",
        "SlurmctldPidFile=/tmp/sbx/slurmctld.pid",
        "Prolog=/tmp/sbx/prolog.sh",
        "Epilog=/tmp/sbx/epilog.sh",
        "PrologFlags=Alloc",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "SlurmctldParameters=preempt_send_user_signal",
        "AuthInfo=cred_expire=5",
        "SchedulerParameters=bf_interval=1,sched_interval=2,nohold_on_prolog_fail",
        "ReturnToService=1",
        "KillWait=10",
        "AccountingStorageType=accounting_storage/none",
        "SlurmdParameters=config_overrides",
    ],
)
def test_conf_has_required_line(line: str) -> None:
    assert line in conf_lines()


@pytest.mark.parametrize(
    "nodes, node_list, ports",
    [
        (1, "NodeName=n1", "Port=17001"),
        (3, "NodeName=n[1-3]", "Port=[17001-17003]"),
        (12, "NodeName=n[1-12]", "Port=[17001-17012]"),
    ],
)
def test_conf_gives_each_node_its_own_port(nodes: int, node_list: str, ports: str) -> None:
    node_line = [line for line in conf_lines(nodes) if line.startswith("NodeName=")]
    assert len(node_line) == 1
    fields = node_line[0].split()
    assert node_list in fields and ports in fields and "NodeAddr=127.0.0.1" in fields


def test_conf_partitions_debug_default_high_preempts() -> None:
    rows = [line.split() for line in conf_lines() if line.startswith("PartitionName=")]
    partitions = {row[0]: row[1:] for row in rows}
    assert set(partitions) == {"PartitionName=debug", "PartitionName=high"}
    debug = partitions["PartitionName=debug"]
    assert "Default=YES" in debug and any(f.startswith("GraceTime=") for f in debug)
    tier = {name: int(next(f for f in fields if f.startswith("PriorityTier=")).split("=")[1])
            for name, fields in partitions.items()}
    assert tier["PartitionName=high"] > tier["PartitionName=debug"]


def test_conf_keys_are_unique_and_paths_stay_in_state_dir() -> None:
    rows = [line for line in conf_lines() if line and not line.startswith(("#", "NodeName", "PartitionName"))]
    settings = [line.split("=", 1) for line in rows]
    keys = [key for key, _ in settings]
    assert len(keys) == len(set(keys))
    paths = [value for _, value in settings if value.startswith("/") and value != "/bin/true"]
    assert paths and all(p.startswith(DIR + "/") for p in paths), paths


@pytest.mark.parametrize(
    "path, ok",
    [
        ("/tmp/resilient_slurm_sandbox", True),
        ("relative/dir", False),
        ("/tmp/with space", False),
        ("/tmp/per%cent", False),
        ("/tmp/hash#", False),
        ("/tmp/" + "x" * 70, False),
    ],
)
def test_check_state_dir(path: str, ok: bool) -> None:
    verdict, reason = sandbox.check_state_dir(path)
    assert verdict is ok and reason


# One sinfo row per node and partition, as `sinfo --noheader --Node --format=%N %T %E` prints.
SINFO_UP = "n1 idle none\nn1 idle none\nn2 idle none\nn2 idle none\nn3 idle none\nn3 idle none\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (SINFO_UP, {"n1": ("idle", "", ""), "n2": ("idle", "", ""), "n3": ("idle", "", "")}),
        ("n1 idle* none\n", {"n1": ("idle", "*", "")}),
        ("n1 unknown* none\n", {"n1": ("unknown", "*", "")}),
        ("n2 drained Prolog error\n", {"n2": ("drained", "", "Prolog error")}),
        ("n3 down* Not responding\n", {"n3": ("down", "*", "Not responding")}),
        ("n1 idle~ none\n", {"n1": ("idle", "~", "")}),
        ("n1 mixed\n", {"n1": ("mixed", "", "")}),
        ("", {}),
        ("\n  \n", {}),
    ],
)
def test_parse_sinfo(text: str, expected: dict[str, tuple[str, str, str]]) -> None:
    nodes = sandbox.parse_sinfo(text)
    assert {name: (n.state, n.flags, n.reason) for name, n in nodes.items()} == expected


@pytest.mark.parametrize(
    "text, expected_nodes, ready, reason_has",
    [
        (SINFO_UP, ["n1", "n2", "n3"], True, "3 nodes idle"),
        (SINFO_UP, ["n1", "n2", "n3", "n4"], False, "n4 is not in sinfo"),
        ("n1 idle none\nn2 idle* none\n", ["n1", "n2"], False, "n2 is idle* (not responding)"),
        ("n1 unknown* none\n", ["n1"], False, "n1 is unknown*"),
        ("n1 idle none\nn2 drained xid 79\n", ["n1", "n2"], False, "n2 is drained (xid 79)"),
        ("n1 down none\n", ["n1"], False, "n1 is down"),
        ("n1 allocated none\n", ["n1"], False, "n1 is allocated"),
        ("n1 completing none\n", ["n1"], False, "n1 is completing"),
        ("", ["n1"], False, "n1 is not in sinfo"),
    ],
)
def test_judge_ready(text: str, expected_nodes: list[str], ready: bool, reason_has: str) -> None:
    verdict, reason = sandbox.judge_ready(sandbox.parse_sinfo(text), expected_nodes)
    assert verdict is ready
    assert reason_has in reason


def test_nodes_to_resume_picks_only_down_and_drained() -> None:
    text = "n1 idle none\nn2 drained Prolog error\nn3 down* x\nn4 draining y\nn5 mixed none\nn6 idle* none\n"
    assert sandbox.nodes_to_resume(sandbox.parse_sinfo(text)) == ["n2", "n3", "n4"]


def test_hosts_line_is_marked() -> None:
    line = sandbox.hosts_line(["n1", "n2"])
    assert line.startswith("127.0.0.1 n1 n2 ") and line.rstrip().endswith(sandbox.HOSTS_MARK)


# The wrappers are shell: run them the way slurmd does, with no PATH and the node name.


def run_wrapper(tmp_path: Path, hook_argv: list[str]) -> subprocess.CompletedProcess[str]:
    wrapper = tmp_path / "prolog.sh"
    wrapper.write_text(sandbox.render_hook_wrapper(DIR, "prolog", hook_argv))
    env = {"SLURMD_NODENAME": "n2", "SLURM_JOB_ID": "7"}
    return subprocess.run(["/bin/sh", str(wrapper)], env=env, capture_output=True, text=True, timeout=10)


def write_hook(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_wrapper_without_hook_exits_0(tmp_path: Path) -> None:
    assert run_wrapper(tmp_path, []).returncode == 0


def test_wrapper_skips_a_hook_that_is_not_there_yet(tmp_path: Path) -> None:
    assert run_wrapper(tmp_path, [str(tmp_path / "xid_scan"), "--flag"]).returncode == 0


def test_wrapper_gives_the_hook_its_node_env_and_args(tmp_path: Path) -> None:
    hook_dir = tmp_path / "a hook's dir"
    hook_dir.mkdir()
    hook = write_hook(
        hook_dir / "hook", 'echo "$RESILIENT_SLURM_SANDBOX|$SANDBOX_NODE|$SLURM_JOB_ID|$PATH|$*"\nexit 3\n'
    )
    done = run_wrapper(tmp_path, [str(hook), "--kernel-log", "/x y"])
    assert done.stdout.strip() == f"{DIR}|n2|7|{sandbox.SYSTEM_PATH}|--kernel-log /x y"
    assert done.returncode == 3, "the hook's verdict must reach slurmd"


def test_env_file_sets_slurm_conf(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text(sandbox.render_env_file(DIR))
    done = subprocess.run(["/bin/sh", "-c", f'. {env_file}; echo "$SLURM_CONF $RESILIENT_SLURM_SANDBOX"'],
                          env={"PATH": os.defpath}, capture_output=True, text=True, timeout=10)
    assert done.stdout.split() == [f"{DIR}/slurm.conf", DIR]


@pytest.mark.parametrize("nodes", [1, 3, 12])
def test_conf_nodes_reads_back_the_rendered_roster(nodes: int) -> None:
    assert sandbox.conf_nodes(sandbox.render_slurm_conf(DIR, nodes)) == sandbox.node_names(nodes)


def test_conf_nodes_of_a_foreign_conf_is_empty() -> None:
    assert sandbox.conf_nodes("NodeName=gpu[001-004] CPUs=8\n") == []


# The CLI's shell, where it needs neither root nor a running Slurm.


def test_status_of_an_empty_dir_says_not_up(capsys: pytest.CaptureFixture[str]) -> None:
    # Not tmp_path: under pytest-xdist it is longer than a state dir may be (unix socket paths).
    with tempfile.TemporaryDirectory(dir="/tmp") as empty:
        assert sandbox.main(["status", "--dir", empty]) == sandbox.Exit.NOT_UP
    assert "is not up" in capsys.readouterr().out


def test_unusable_dir_is_one_line_with_its_own_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert sandbox.main(["status", "--dir", "/tmp/has space"]) == sandbox.Exit.BAD_DIR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "choose another --dir" in err


def test_exit_codes_are_distinct() -> None:
    # __members__ keeps aliases, which an IntEnum makes of repeated values.
    members = sandbox.Exit.__members__
    assert len(set(members.values())) == len(members)
