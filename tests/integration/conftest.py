"""The uninterrupted reference runs that several integration files compare against, launched once."""

from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from tests.integration.runs import SHORT, finish, launch, run_dir


@pytest.fixture(scope="session")
def short_straight(tmp_path_factory):
    """`short_straight(ranks)`: the run dir of runs.SMALL + runs.SHORT at `ranks`, run to the end."""
    runs: dict[int, Path] = {}

    def at(ranks: int) -> Path:
        if ranks not in runs:
            root = tmp_path_factory.mktemp(f"short_straight{ranks}")
            code, out = finish(launch(root, "straight", *SHORT, f"cluster.ranks={ranks}"))
            assert code == ExitCode.DONE, out
            runs[ranks] = run_dir(root, "straight")
        return runs[ranks]
    return at
