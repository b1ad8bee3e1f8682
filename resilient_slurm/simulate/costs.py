"""What getting back to training costs, as (cause, seconds) segments. Pure; random draws come
from the caller's generator.

A requeue (the seed's recipe: stop, get nodes from the scheduler, restart) pays Slurm's hold on a
requeued job (its credential delay, 121 s by default, then the next backfill pass), the wait for
nodes, and a full process start. A restart inside the allocation (issue 14) pays only a new job
step. Either way the checkpoint is then loaded: from the hot tier, or from the cold tier when a
node that held part of it is gone and no buddy holds a copy.

Issue 23 adds, per strategy: a hang found by heartbeat (`heartbeat_s`) instead of at the collective
timeout; a load from the memory tier (the own node's, and the buddy's for the ranks of a node
that left); and a restart inside the surviving processes, broken down as its restart event
records it: placement; the survivors' teardown, while the replacement's processes start (only the
part of that start the teardown does not hide is lost to it); the rendezvous; the load; the data
loader; the first step's extra over a steady one. It is refused after a hang or a CUDA-class
error (`failures.survivors_trusted`), which take today's step restart.
"""

from __future__ import annotations

import random

from resilient_slurm.simulate.failures import Fault, survivors_trusted
from resilient_slurm.simulate.scenario import Scenario, Strategy

CAUSES = ("checkpoint", "memory_checkpoint", "redone", "detect", "scheduler", "queue", "teardown", "placement",
          "startup", "rendezvous", "load_memory", "load_buddy", "load", "cold_fallback", "data_ready", "first_step",
          "comm_init", "quorum", "degraded", "straggler", "sdc", "sentinel", "shrink", "manual", "spares")
"""Where lost GPU-time goes, in report order: blocked by disk saves; blocked by memory-tier saves;
work lost since the last checkpoint and done again; failure to decision (a hang's timeout, a
crash's detection); Slurm's hold on a requeued job; the wait for nodes; the survivors' teardown;
placement; process start (a step restart's, or the part of a replacement's the teardown does not
hide); the rendezvous; loads from the own node's memory, the buddy's (beyond the own node's), the
hot tier, and the cold tier's extra; the data loader; the first step's extra; creating the world's
communicators after a restart; quorum changes as replica groups leave and join; the steps slower
while a group heals, or while a straggler lasts; silent data corruption (its rollbacks, and work
done on corrupted weights); the SDC sentinel's checks; GPUs missing from a shrunk run; waiting for a
person after the job gave up; spare nodes held idle."""

Segments = list[tuple[str, float]]


def detection(s: Scenario, hang: bool, heartbeat: bool = False) -> Segments:
    if hang:
        return [("detect", s.heartbeat_s if heartbeat else s.hang_detect_s)]
    return [("detect", s.crash_detect_s)] if s.crash_detect_s else []


def requeue(s: Scenario, rng: random.Random) -> Segments:
    return [("scheduler", s.cred_delay_s + rng.uniform(0.0, s.backfill_s)),
            ("queue", rng.uniform(s.queue_min_s, s.queue_max_s)),
            ("startup", s.restart_s)]


def in_allocation(s: Scenario) -> Segments:
    return [("startup", s.in_alloc_restart_s)]


def in_process(s: Scenario, replaced: bool) -> Segments:
    """Up to the load; `replaced`: a node left, so replacement processes start on its successor."""
    start = max(s.replacement_start_s - s.teardown_s, 0.0) if replaced else 0.0
    return [("placement", s.placement_s), ("teardown", s.teardown_s), ("startup", start),
            ("rendezvous", s.rendezvous_s)]


def after_load(s: Scenario) -> Segments:
    """An in-process restart after its load (a step restart's are inside `in_alloc_restart_s`)."""
    return [("data_ready", s.data_ready_s), ("first_step", s.first_step_s)]


def restart_path(s: Scenario, st: Strategy, fault: Fault, replaced: bool) -> tuple[str, Segments, Segments]:
    """A restart inside the allocation: its path (for the counts), and what it costs before and
    after the load."""
    trusted, why = survivors_trusted(fault)
    trusted = trusted or (why == "CUDA error" and replaced and s.cuda_error_in_process)
    if st.in_process and trusted:
        return "in process", in_process(s, replaced), after_load(s)
    return ("step restart" if not st.in_process else f"step restart ({why})"), in_allocation(s), []


def load(s: Scenario, cold: bool) -> Segments:
    return [("load", s.load_s)] + ([("cold_fallback", s.cold_load_s - s.load_s)] if cold else [])


def memory_load(s: Scenario, from_buddy: bool) -> Segments:
    """Every rank reads its own node's memory; with `from_buddy`, the ranks of a node that left
    read their buddy's at the same time, so only the longer wait counts."""
    extra = [("load_buddy", max(s.buddy_load_s - s.memory_load_s, 0.0))] if from_buddy else []
    return [("load_memory", s.memory_load_s)] + extra
