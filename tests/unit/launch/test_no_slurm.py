"""`cluster=slurm` where there is no Slurm: one line, exit status 2, and no run directory left behind.
Both cases are real: a PATH without sbatch, and this machine's sbatch with no Slurm configuration to
read (skipped where one is configured, since the launch would then really submit)."""

import os
import shutil
import subprocess

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.__main__ import main


def test_no_sbatch_on_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code = main(["+experiment=tiny_sft", "cluster=slurm", f"run.root={tmp_path}"])
    assert code == ExitCode.CONFIG
    assert capsys.readouterr().err == ("resilient_slurm: config error: cluster=slurm: no sbatch on PATH, so no Slurm "
                                       "to submit to here; run on a Slurm login node, or use cluster=local\n")
    assert list(tmp_path.iterdir()) == []


def test_an_sbatch_without_a_slurm_configuration(tmp_path, monkeypatch, capsys):
    if shutil.which("sbatch") is None:
        pytest.skip("no sbatch installed here")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    probe = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    if probe.returncode == 0:
        pytest.skip("Slurm is configured here: the launch would submit a job")
    code = main(["+experiment=tiny_sft", "cluster=slurm", f"run.root={tmp_path}"])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG and len(err.splitlines()) == 1, err
    assert err.startswith("resilient_slurm: error: cluster=slurm: sbatch refused the job: sbatch: ")
    assert err.endswith("; check that Slurm is configured here (sinfo), or use cluster=local\n")
    assert list(tmp_path.iterdir()) == []  # the run directory and its experiment's are gone again
