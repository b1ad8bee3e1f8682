"""`python -m resilient_slurm.sweep +experiment=NAME sweep=grid|random|optuna|asha|pbt sweep.trials=N
sweep.parallel=P 'KEY=SPACE' ...`: a hyperparameter search whose trials are ordinary runs.

Runs the controller here (a login node, a laptop) or, with `sweep.controller=slurm`, submits it as
a small requeueable job. The same command resumes a stopped or killed controller.
"""

from __future__ import annotations

import os
import sys

from resilient_slurm.process.threads import yield_when_idle

yield_when_idle(os.environ)  # the trials started from here inherit it, before they import torch

from resilient_slurm.exit_codes import ExitCode  # noqa: E402
from resilient_slurm.sweep import cli
from resilient_slurm.sweep.study import StudyError


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        from resilient_slurm.launch.help import topic

        print(cli.USAGE + "\n\n" + cli.GUIDE + "\nEvery sweep.* key (python -m resilient_slurm.launch --help KEY for "
              "any other):\n" + (topic("sweep") or ""), end="")
        return ExitCode.DONE
    plan = cli.parse(argv)
    if plan is None:
        return ExitCode.CONFIG
    try:
        if plan.cfg.sweep.controller == "slurm":
            from resilient_slurm.sweep.remote import submit_controller

            submit_controller(plan, argv)
            return ExitCode.DONE
        from resilient_slurm.sweep import session

        return session.run(plan)
    except (cli.SweepError, StudyError) as e:
        cli.error(e)
        return ExitCode.CONFIG


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
