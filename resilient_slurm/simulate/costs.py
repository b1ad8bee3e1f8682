"""What getting back to training costs, as (cause, seconds) segments. Pure; random draws come
from the caller's generator.

A requeue (the seed's recipe: stop, get nodes from the scheduler, restart) pays Slurm's hold on a
requeued job (its credential delay, 121 s by default, then the next backfill pass), the wait for
nodes, and a full process start. A restart inside the allocation (issue 14) pays only a new job
step. Either way the checkpoint is then loaded: from the hot tier, or from the cold tier when a
node that held part of it is gone and no buddy holds a copy.
"""

from __future__ import annotations

import random

from resilient_slurm.simulate.scenario import Scenario

CAUSES = ("checkpoint", "redone", "detect", "scheduler", "queue", "startup", "load", "cold_fallback", "shrink",
          "manual", "spares")
"""Where lost GPU-time goes, in report order: blocked by saves; work lost since the last
checkpoint and done again; waiting for a hang to time out; Slurm's hold on a requeued job; the wait
for nodes; process start; checkpoint load; the cold tier's extra load time; GPUs missing from a
shrunk run; waiting for a person after the job gave up; spare nodes held idle."""

Segments = list[tuple[str, float]]


def detection(s: Scenario, hang: bool) -> Segments:
    return [("detect", s.hang_detect_s)] if hang else []


def requeue(s: Scenario, rng: random.Random) -> Segments:
    return [("scheduler", s.cred_delay_s + rng.uniform(0.0, s.backfill_s)),
            ("queue", rng.uniform(s.queue_min_s, s.queue_max_s)),
            ("startup", s.restart_s)]


def in_allocation(s: Scenario) -> Segments:
    return [("startup", s.in_alloc_restart_s)]


def load(s: Scenario, cold: bool) -> Segments:
    return [("load", s.load_s)] + ([("cold_fallback", s.cold_load_s - s.load_s)] if cold else [])
