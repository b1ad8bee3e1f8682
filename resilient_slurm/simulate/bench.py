"""What the benches measured, as the simulator's inputs. Pure.

`--from-bench FILE` reads the JSON object that `bench/checkpoint.py --json FILE`,
`bench/restart.py --json FILE` or `bench/replica.py --json FILE` writes. Every key is optional; a file needs at least one that the
simulator reads, and unknown keys are ignored (a file may say more than the simulator uses).

Keys read, in seconds unless named otherwise (medians over the bench's repetitions):

bench/checkpoint.py (one rank's shard of `bytes`):
    bytes              bytes one rank saves (→ ckpt_bytes; and the size the byte-bound costs
                       were measured at, for `--scale-to`)
    save_s             a synchronous save from its start to committed (→ save_s)
    blocking_s         an async save: the loop blocked until the call returned (→ blocking_s)
    lost_s             an async save: blocked, plus the training slowdown while it wrote; wins
                       over blocking_s, since it is what a background save costs (→ blocking_s)
    load_s             restore from the hot tier into the training objects (→ load_s)
    cold_load_s        restore from the cold tier (→ cold_load_s)
    memory_bytes       bytes one rank keeps in the memory tier (default: bytes)
    memory_blocking_s  a memory-tier save: the loop blocked (the device→host copy) (→ memory_blocking_s)
    memory_save_s      a memory-tier save from its start until the own node's copy and the
                       buddy's are both committed (→ memory_save_s)
    memory_load_s      restore from the own node's memory tier (→ memory_load_s)
    buddy_load_s       restore from the buddy node's memory tier, over the network (→ buddy_load_s)

bench/restart.py (a run of `ranks` ranks on the sandbox):
    ranks                  world size of the runs measured (for `--scale-to`)
    steady_step_s          a training step's median time in those runs
    heartbeat_timeout_s    monitor.heartbeat_timeout_s the hang runs used
    heartbeat_detect_s     SIGSTOP of one rank → the monitor's hang decision (→ heartbeat_s)
    collective_timeout_s   cluster.collective_timeout_s the hang runs used
    collective_detect_s    the same hang found by the collective timeout (→ hang_detect_s)
    crash_detect_s         SIGKILL of one rank → the driver's decision (→ crash_detect_s)
    <path>_<part>_s        a restart's breakdown, as its restart event records it, for path
                           `inprocess` (the survivors restart in their processes), `step` (a new
                           job step on every rank) and `requeue`; part is one of
                             detect        failure → decision
                             teardown      the survivors leave the broken group (step: the old
                                           step ends)
                             placement     the driver chooses the nodes (spare, in place)
                             process_start new processes start (inprocess: the replacement
                                           only) until they reach the rendezvous
                             rendezvous    every rank meets on the new store or port
                             load          the checkpoint is in the training objects
                             data_ready    the data loader is at the resumed position
                             first_step    the first step after the restart, start to end
    <path>_restart_s       failure → the first step's end (the total; a check on the parts)
    <path>_load_source     memory, buddy, hot or cold (text; reported, not read)

bench/replica.py (runs of `ranks` ranks in `replica_groups` HSDP replica groups on the sandbox,
per-step fault tolerance on; until it exists, the scenario takes the published or assumed values
`scenario.SOURCES` names):
    replica_groups     parallel.dp_replicate of the runs measured (context)
    steady_step_s      a step's median time with every group live (context, as for restart.py)
    short_step_s       the survivors' median step while short a group (→ degraded_overhead =
                       short_step_s / steady_step_s / (replica_groups / (replica_groups - 1)): the
                       step's cost beyond the ideal extra accumulation)
    quorum_s           the survivors' stall beyond a steady step when a group leaves (a crash,
                       found at once) and when it joins, the median of both (→ quorum_s)
    heal_s             a replacement group, from its processes' start to its first step in the
                       quorum: the state from a live group over the network, no disk (→ heal_s)
    heal_bytes         bytes one rank of the healing group received (for `--scale-to`; default bytes)
    fingerprint_s      the SDC sentinel's cost per step: the checksum of a rank's shards and the
                       compare across replicas (→ fingerprint_s)
    straggler_found_s  a rank slowed (a CPU quota) → declared a straggler (→ straggler_detect_s)
Reported by it and not read (the simulator derives them from the above): failure → the
survivors' next step (`survivors_next_step_s`), `sdc_heal_s` (a flipped bit found → healed),
`straggler_swap_s` (found → swapped), `hang_culprit_s` (a hang → its culprit named).

Scenario fields derived from the breakdown (a restart costs what a steady step does not):
    replacement_start_s = inprocess_process_start_s, teardown_s = inprocess_teardown_s,
    placement_s, rendezvous_s, data_ready_s likewise; first_step_s = inprocess_first_step_s -
    steady_step_s; in_alloc_restart_s = the step path's parts from teardown to first step, minus
    steady_step_s (detect and load are costs of their own); restart_s = the requeue path's parts
    from process_start to first step, minus steady_step_s. The older single keys
    `in_alloc_restart_s` and `restart_s` still work; the breakdown wins where both are given.
"""

from __future__ import annotations

from typing import Any

BENCH_KEYS = {"save_s": "save_s", "lost_s": "blocking_s", "blocking_s": "blocking_s", "load_s": "load_s",
              "cold_load_s": "cold_load_s", "restart_s": "restart_s", "in_alloc_restart_s": "in_alloc_restart_s",
              "bytes": "ckpt_bytes", "memory_blocking_s": "memory_blocking_s", "memory_save_s": "memory_save_s",
              "memory_load_s": "memory_load_s", "buddy_load_s": "buddy_load_s", "heartbeat_detect_s": "heartbeat_s",
              "collective_detect_s": "hang_detect_s", "crash_detect_s": "crash_detect_s",
              "inprocess_teardown_s": "teardown_s", "inprocess_placement_s": "placement_s",
              "inprocess_process_start_s": "replacement_start_s", "inprocess_rendezvous_s": "rendezvous_s",
              "inprocess_data_ready_s": "data_ready_s", "quorum_s": "quorum_s", "heal_s": "heal_s",
              "fingerprint_s": "fingerprint_s", "straggler_found_s": "straggler_detect_s"}
"""Bench JSON key → Scenario field, one to one."""

PARTS = ("detect", "teardown", "placement", "process_start", "rendezvous", "load", "data_ready", "first_step")
PATHS = ("inprocess", "step", "requeue")
SUMS = {"in_alloc_restart_s": ("step", PARTS[1:5] + PARTS[6:]), "restart_s": ("requeue", PARTS[3:5] + PARTS[6:]),
        "first_step_s": ("inprocess", ("first_step",))}
"""Scenario field ← the parts of one path's breakdown that make it (less one steady step)."""

CONTEXT = ("ranks", "steady_step_s", "heartbeat_timeout_s", "collective_timeout_s", "memory_bytes", "replica_groups",
           "heal_bytes")
"""Keys that say how a bench measured, not what: `--scale-to` reads them (and `bytes`)."""

KNOWN = tuple(BENCH_KEYS) + tuple(f"{p}_{part}_s" for p in PATHS for part in PARTS) + CONTEXT + ("short_step_s",)


def measured(raw: Any, source: str) -> dict[str, float]:
    """The numeric keys of a bench JSON the simulator knows, checked. Raises ValueError (one line)."""
    if not isinstance(raw, dict):
        raise ValueError(f"--from-bench {source}: not a JSON object of measured costs; write it with "
                         f"bench/checkpoint.py, bench/restart.py or bench/replica.py --json FILE")
    out: dict[str, float] = {}
    for key in KNOWN:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"--from-bench {source}: {key}={value!r} is not a non-negative number")
        out[key] = float(value)
    if not set(out) - set(CONTEXT):
        raise ValueError(f"--from-bench {source}: none of {', '.join(BENCH_KEYS)} or the restart breakdown "
                         f"(<path>_<part>_s) found; write it with bench/checkpoint.py --json FILE or "
                         f"bench/restart.py --json FILE")
    return out


def to_fields(values: dict[str, float], source: str) -> dict[str, float]:
    """Scenario fields from measured (or scaled) bench keys. Raises ValueError (one line)."""
    out = {target: values[key] for key, target in BENCH_KEYS.items()
           if key in values and not (key == "blocking_s" and "lost_s" in values)}
    for target, (path, parts) in SUMS.items():
        keys = [f"{path}_{part}_s" for part in parts]
        if not any(k in values for k in keys):
            continue
        missing = [k for k in keys if k not in values] + (["steady_step_s"] if "steady_step_s" not in values else [])
        if missing:
            raise ValueError(f"--from-bench {source}: {target} needs {', '.join(missing)} beside "
                             f"{', '.join(k for k in keys if k in values)}; write the whole breakdown")
        out[target] = max(sum(values[k] for k in keys) - values["steady_step_s"], 0.0)
    if "short_step_s" in values:
        missing = [k for k in ("steady_step_s", "replica_groups") if k not in values]
        if missing or values.get("replica_groups", 0) < 2:
            raise ValueError(f"--from-bench {source}: short_step_s needs steady_step_s and replica_groups >= 2 "
                             f"beside it; write them")
        groups = values["replica_groups"]
        out["degraded_overhead"] = max(values["short_step_s"] / values["steady_step_s"] / (groups / (groups - 1)), 1.0)
    return out


def from_bench(raw: Any, source: str) -> dict[str, float]:
    """The Scenario fields a bench JSON measured, as measured (no scaling)."""
    return to_fields(measured(raw, source), source)
