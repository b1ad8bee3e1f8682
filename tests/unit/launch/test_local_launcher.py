import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.local import combine_exit_codes


@pytest.mark.parametrize(
    "codes, combined",
    [
        ([0, 0], ExitCode.DONE),
        ([75, 75], ExitCode.RESUME),
        ([75, 0], ExitCode.RESUME),
        ([1, 75], ExitCode.FAILED),
        ([-9, 0], ExitCode.FAILED),
        ([2, 2], ExitCode.CONFIG),
        ([2, -9], ExitCode.FAILED),
        ([70, 70], ExitCode.GAVE_UP),  # every rank gave up together (the monitor, an OOM at micro-batch 1)
        ([70, 1], ExitCode.FAILED),
    ],
)
def test_one_status_for_the_run(codes, combined):
    assert combine_exit_codes(codes) == combined
