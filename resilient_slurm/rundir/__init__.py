"""A run directory, `<root>/<experiment>/<run>/`: every file of it, the run's identity, and the
writers of the run's own records. Ground floor: everything above reads and writes runs through here.

Modules:
    paths      RunDir(path): one property per file or folder of a run directory        [pure]
    identity   what a run computes (its identity, config hash, changed keys); config.yaml
    meta       run.json: read, written and updated atomically
    metrics    metrics.jsonl (the surviving timeline) and metrics-lost.jsonl (steps redone)
    benchmarks benchmarks.jsonl: benchmark scores of checkpoints, each at its checkpoint's step
    record     record.jsonl: every launch and attempt (job, nodes, versions, git state and diff)
"""

from resilient_slurm.rundir.paths import RunDir

__all__ = ["RunDir"]
