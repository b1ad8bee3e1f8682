"""The run record: git state parsed from real git output, lines composed from gathered facts."""

import shutil
import subprocess

import pytest

from resilient_slurm.rundir import record
from resilient_slurm.rundir.record import GitState, attempt_line, diff_name, parse_status
from resilient_slurm.slurm.env import SlurmEnv


@pytest.mark.parametrize(
    "porcelain, dirty, untracked",
    [
        ("", False, []),
        ("?? new.py\0", False, ["new.py"]),
        (" M a.py\0?? b/c d.txt\0", True, ["b/c d.txt"]),
        ("A  added.py\0", True, []),
        ("R  new name.py\0old name.py\0?? x\0", True, ["x"]),  # a rename carries its source path
        ("!! ignored\0", False, []),
    ],
)
def test_parse_status(porcelain, dirty, untracked):
    assert parse_status(porcelain) == (dirty, untracked)


def test_diff_name_is_per_commit_and_content():
    assert diff_name(GitState(commit="a" * 40)) is None
    one = diff_name(GitState(commit="a" * 40, dirty=True, diff="x"))
    assert one.startswith("git/aaaaaaaaaaaa-") and one.endswith(".diff")
    assert one != diff_name(GitState(commit="a" * 40, dirty=True, diff="y"))


def test_attempt_line_from_slurm_facts():
    env = SlurmEnv(job_id="77", restart_count=2, step_id=0, procid=0, ntasks=4, localid=0, local_ntasks=2, nodename="n1",
                   nodes=("n1", "n2"), cpus_per_task=8)
    git = GitState(commit="c" * 40, branch="main", dirty=True, untracked=["u.py"], diff="patch")
    line = attempt_line("2026-01-01T00:00:00.000Z", 3, 4, env, "n1", 123, git, {"python": "3.11", "cuda": "12.4"})
    assert line["job_id"] == "77" and line["restart"] == 2 and line["nodes"] == ["n1", "n2"]
    assert line["git"] == {"commit": "c" * 40, "branch": "main", "dirty": True, "untracked": ["u.py"],
                           "error": None, "diff": diff_name(git)}
    local = attempt_line("t", 1, 1, None, "host", 1, GitState(error="no git"), {})
    assert local["job_id"] is None and local["nodes"] == ["host"] and local["git"]["diff"] is None


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_state_of_a_real_checkout(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "trunk")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "first")
    (tmp_path / "tracked.py").write_text("a = 1\n")
    git("add", "tracked.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "second")
    clean = record.git_state(tmp_path)
    assert clean.error is None and clean.branch == "trunk" and not clean.dirty and clean.diff == ""
    (tmp_path / "tracked.py").write_text("a = 2\n")
    (tmp_path / "new.py").write_text("b = 3\n")
    state = record.git_state(tmp_path)
    assert state.dirty and state.untracked == ["new.py"] and state.commit == clean.commit
    assert "-a = 1\n+a = 2" in state.diff and "+b = 3" in state.diff  # untracked files are in the patch
    assert record.git_state(tmp_path / "nowhere").error.startswith("git rev-parse exited")


def test_record_attempt_appends_and_saves_the_diff_once(tmp_path, monkeypatch):
    state = GitState(commit="d" * 40, branch="b", dirty=True, diff="the patch")
    monkeypatch.setattr(record, "git_state", lambda: state)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    first = record.record_attempt(tmp_path, 1)
    second = record.record_attempt(tmp_path, 1)
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert (tmp_path / first["git"]["diff"]).read_text() == "the patch"
    assert len(list((tmp_path / "git").iterdir())) == 1
    assert first["versions"]["python"] and first["versions"]["torch"]
    assert record.process_started() is not None
