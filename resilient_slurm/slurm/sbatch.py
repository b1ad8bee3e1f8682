"""The one place that runs `sbatch` for jobs of the run's own (its benchmark evaluations); the run
itself is submitted through submitit. Never raises. Standard library only."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

DEFAULT_SBATCH = "/usr/bin/sbatch"
SBATCH_TIMEOUT_S = 60.0


def sbatch(script: str, binary: str = DEFAULT_SBATCH, timeout_s: float = SBATCH_TIMEOUT_S,
           env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Submit the batch script `script` (its `#SBATCH` lines give the options) in `env` (default:
    this process's environment); (ok, job id or a one-line reason)."""
    try:
        done = subprocess.run([binary, "--parsable"], input=script.encode(), capture_output=True, timeout=timeout_s,
                              check=False, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **(os.environ if env is None else env)})
    except subprocess.TimeoutExpired:
        return False, f"{binary} did not answer within {timeout_s:g} s"
    except OSError as exc:
        return False, f"cannot run {binary}: {exc.strerror}"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"{binary} exited {done.returncode}: {why[0] if why else 'no message'}"
    # --parsable prints `jobid` or `jobid;cluster`.
    return True, done.stdout.decode("utf-8", "replace").strip().split(";")[0]
