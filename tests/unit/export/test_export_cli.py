"""`python -m resilient_slurm.export` as a user runs it: its help at once, and its bar on a terminal."""

import subprocess
import sys
from pathlib import Path


from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config
from resilient_slurm.model.decoder import plain_model
from resilient_slurm.rundir.identity import write_config
from tests.single_rank import one_rank
from tests.unit.test_console import on_a_terminal

REPO = Path(__file__).resolve().parents[3]


def test_the_help_is_whole_and_imports_neither_torch_nor_the_export():
    code = ("import sys; from resilient_slurm.export.__main__ import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.endswith("False\n"), done.stderr
    assert "Exit status: 0 written, 1 the checkpoint or the export failed, 2 usage." in done.stdout


def test_the_dtypes_offered_are_the_ones_the_export_writes():
    from resilient_slurm.export.__main__ import DTYPES
    from resilient_slurm.export.from_checkpoint import DTYPES as WRITTEN

    assert sorted(DTYPES) == sorted(WRITTEN)


def test_on_a_terminal_the_export_draws_a_bar(tmp_path):
    """Issue 27, item 14, through a real terminal (a pty), however long the run's path."""
    run = tmp_path / ("a-run-directory-with-a-long-name-" + "x" * 60)
    cfg = Config()
    run.mkdir()
    write_config(run, cfg)
    model = plain_model(cfg.model, seed=0)
    save(run / "checkpoints", 3, capture_snapshot(model, None, None, TrainState(step=3)), one_rank(), 1 << 30, 1)
    out = on_a_terminal([sys.executable, "-m", "resilient_slurm.export", str(run), str(tmp_path / "hf")], 100)
    text = out.decode()
    bars = [part for part in text.replace("\r\n", "\r").split("\r") if "tensor" in part and "|" in part]
    assert bars and "100%|" in bars[-1] and "█" in bars[-1], text
    assert f"exported step 3 of {run}" in text
    assert (tmp_path / "hf" / "config.json").is_file()
