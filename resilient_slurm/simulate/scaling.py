"""Costs measured here, scaled to the machine a scenario runs on (`--scale-to`). Pure.

The benches measure a tiny model on the project's machine: 2 vCPU, no GPU, one virtio disk, and
a Slurm sandbox whose nodes are all that one machine. The seed's scenario trains an 8B model on
1,250 H100 nodes. `scale` maps each measured bench key (`bench.py`) to the target by its rule:

    rule        bench keys                           scaled value
    ----------  -----------------------------------  ------------------------------------------------
    bytes       save_s (disk write);                 fixed + bytes there / bandwidth there, where
                blocking_s, lost_s,                  fixed = max(0, measured - bytes here /
                memory_blocking_s, memory_load_s     bandwidth here): what the medium's speed here
                (host link); load_s (disk read);     does not explain is a fixed cost, kept as
                cold_load_s (shared storage);        measured
                memory_save_s, buddy_load_s
                (network); heal_s (network);
                fingerprint_s (device memory)
    ranks       *_teardown_s, *_rendezvous_s,        measured x log2(ranks there) / log2(ranks
                *_first_step_s, steady_step_s,       here), never below the published anchor (NVRx,
                short_step_s
                                                     below) scaled the same way
    timeout     heartbeat_detect_s,                  the target's timeout + what the bench took
                collective_detect_s                  beyond its own timeout
    same        crash_detect_s, *_detect_s, quorum_s as measured: one node's or one rank's work, it
                (over the replica groups, as many
                here as there), straggler_found_s,
                *_placement_s, *_process_start_s,    does not grow with the run (a restart's own
                *_data_ready_s, in_alloc_restart_s,  *_load_s is only reported)
                restart_s
    target's    bytes, memory_bytes                  the bytes per rank there (below)

steady_step_s is scaled like the first step it is subtracted from, so a restart's extra over a
steady step grows by the ranks rule too.

Media, bandwidth per rank in GB/s:

    medium          here (measured: shared/notes/perf-baseline.md)  8b-h100 (published)
    --------------  ----------------------------------------------  ---------------------------------------
    host link       11: torch copy_ into reused buffers,            64: PCIe Gen5 x16 (128 GB/s both ways)
                    2 threads (10.3-12.7)                           per H100
    disk write      1.1: dd oflag=direct (0.99-1.12)                3.1: a DGX H100's 8 x 3.84 TB U.2 NVMe
                                                                    read at ~50 GB/s (~7 GB/s each); write
                                                                    taken as half (no figure found); over
                                                                    8 GPUs
    disk read       0.7: dd, cold (0.59-0.76)                       6.25: 50 GB/s over 8 GPUs
    shared storage  0.7: the same disk                              0.122: Llama 3's 2 TB/s sustained for
                                                                    16,384 GPUs
    network         11: the sandbox's nodes are this machine; no    50: one ConnectX-7 400 Gb/s per GPU
                    figure, so the host link, an upper bound
                    (which keeps the fixed part large)
    device memory   11: the CPU's memory, as the host link          3,350: H100 SXM HBM3

Bytes per rank: here the bench's `bytes` (`memory_bytes` for the memory tier, `heal_bytes` for a
heal); there the model's parameters x bytes per parameter / the GPUs it is sharded over: 8.03e9 x
12 (fp32 weights and AdamW's two moments, what the project's checkpoint holds) / 10,000 (FSDP over
every GPU) = 9.6 MB; a heal and a fingerprint cover a replica group's GPU, `groups` times that
(each of the `replica_groups` groups holds the whole state).
Ranks there: the scenario's GPUs. Anchors: NVRx's documented in-process restart latency, a
TCPStore barrier of 0.5 s at 16,384 ranks (rendezvous) and ~0.5 s to destroy the process group
(teardown). Sources: DGX H100 in NVIDIA's DGX BasePOD reference architecture (8 single-port
ConnectX-7 at 400 Gb/s, eight 3.84 TB U.2 NVMe, 2 TB DDR5, PCIe 5.0); NVMe rates from the NCP-AII
study guide (flashgenius.net); Llama Team 2024 §3.3.4; NVRx docs/source/inprocess/usage_guide.rst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from resilient_slurm.simulate.bench import PATHS

GB = 1e9


@dataclass(frozen=True)
class Machine:
    """Where a cost was measured or is to be had: bandwidth per rank of each medium, bytes/s."""

    name: str
    host_link: float
    disk_write: float
    disk_read: float
    shared_storage: float
    network: float
    device_memory: float


@dataclass(frozen=True)
class Profile:
    """A target: its machine and the model whose state the byte-bound costs move."""

    machine: Machine
    params: float
    bytes_per_param: float
    """What a checkpoint holds per parameter: fp32 weights and AdamW's two moments = 12."""
    shard_gpus: int | None = None
    """GPUs the state is sharded over; None: every GPU of the run (FSDP over all of them)."""

    def bytes_per_rank(self, gpus: int) -> float:
        return self.params * self.bytes_per_param / (self.shard_gpus or gpus)


HERE = Machine("this project's machine (2 vCPU VM, virtio disk)", host_link=11 * GB, disk_write=1.1 * GB,
               disk_read=0.7 * GB, shared_storage=0.7 * GB, network=11 * GB, device_memory=11 * GB)
H100 = Machine("DGX H100 node (8 GPUs)", host_link=64 * GB, disk_write=25 * GB / 8, disk_read=50 * GB / 8,
               shared_storage=2e12 / 16_384, network=50 * GB, device_memory=3350 * GB)
PROFILES = {"8b-h100": Profile(H100, params=8.03e9, bytes_per_param=12.0)}

MEDIUM = {"save_s": "disk_write", "blocking_s": "host_link", "lost_s": "host_link", "memory_blocking_s": "host_link",
          "memory_load_s": "host_link", "load_s": "disk_read", "cold_load_s": "shared_storage",
          "memory_save_s": "network", "buddy_load_s": "network", "heal_s": "network",
          "fingerprint_s": "device_memory"}
"""Byte-bound keys → the medium their bytes cross."""
GROUP_KEYS = ("heal_s", "fingerprint_s")
MEMORY_KEYS = ("memory_blocking_s", "memory_save_s", "memory_load_s", "buddy_load_s")
RANKS_PARTS = ("teardown", "rendezvous", "first_step")
ANCHORS = {"rendezvous": (0.5, 16_384), "teardown": (0.5, 16_384)}
"""NVRx: (seconds, at ranks)."""
TIMEOUTS = {"heartbeat_detect_s": "heartbeat_timeout_s", "collective_detect_s": "collective_timeout_s"}


def rule(key: str) -> str:
    """The rule a bench key scales by: bytes, ranks, timeout, or same."""
    if key in MEDIUM:
        return "bytes"
    if key in TIMEOUTS:
        return "timeout"
    if key in ("steady_step_s", "short_step_s") or any(key.endswith(f"_{part}_s") for part in RANKS_PARTS):
        return "ranks"
    return "same"


def scale(values: Mapping[str, float], profile: Profile, gpus: int, timeouts: Mapping[str, float],
          source: str, groups: int = 1) -> tuple[dict[str, float], dict[str, str]]:
    """Every measured bench key at the target (context keys pass through), and for each key that
    changed or was kept, how. `timeouts`: the target's heartbeat_timeout_s and collective_timeout_s;
    `groups`: its replica groups (a heal and a fingerprint move a group's GPU's share).
    Raises ValueError (one line) when a rule lacks what the bench must say about itself."""
    out: dict[str, float] = {}
    how: dict[str, str] = {}
    ranks_here = values.get("ranks")
    for key, value in values.items():
        kind = rule(key)
        if key in ("bytes", "memory_bytes"):
            out[key] = profile.bytes_per_rank(gpus)
            how[key] = (f"{profile.params:.3g} parameters x {profile.bytes_per_param:g} B / "
                        f"{profile.shard_gpus or gpus} GPUs")
            continue
        if key in ("ranks", "heartbeat_timeout_s", "collective_timeout_s", "replica_groups", "heal_bytes"):
            out[key] = value
            continue
        if kind == "bytes":
            size_key = "memory_bytes" if key in MEMORY_KEYS and "memory_bytes" in values else \
                "heal_bytes" if key == "heal_s" and "heal_bytes" in values else "bytes"
            if size_key not in values:
                raise ValueError(f"--scale-to: {source} gives {key} but not the bytes it moved; add `bytes`")
            medium = MEDIUM.get(key, "host_link")
            target = profile.bytes_per_rank(gpus) * (groups if key in GROUP_KEYS else 1)
            here = values[size_key] / getattr(HERE, medium)
            there = target / getattr(profile.machine, medium)
            out[key] = max(value - here, 0.0) + there
            how[key] = (f"{max(value - here, 0.0):.3g} s fixed + {target / 1e6:.3g} MB at "
                        f"{getattr(profile.machine, medium) / GB:.3g} GB/s ({medium})")
        elif kind == "ranks":
            if ranks_here is None:
                raise ValueError(f"--scale-to: {source} gives {key} but not the ranks it ran; add `ranks`")
            factor = math.log2(max(gpus, 2)) / math.log2(max(ranks_here, 2))
            anchor = ANCHORS.get(_part(key))
            floor = anchor[0] * math.log2(max(gpus, 2)) / math.log2(anchor[1]) if anchor else 0.0
            out[key] = max(value * factor, floor)
            how[key] = f"x {factor:.3g} (log2 ranks {ranks_here:g} -> {gpus})" + (
                f", NVRx floor {floor:.3g} s" if anchor else "")
        elif kind == "timeout":
            bench_timeout = values.get(TIMEOUTS[key])
            if bench_timeout is None:
                raise ValueError(f"--scale-to: {source} gives {key} but not {TIMEOUTS[key]}; add it")
            out[key] = timeouts[TIMEOUTS[key]] + max(value - bench_timeout, 0.0)
            how[key] = f"timeout {timeouts[TIMEOUTS[key]]:g} s + {max(value - bench_timeout, 0.0):.3g} s overshoot"
        else:
            out[key] = value
            how[key] = "as measured (does not grow with the run)"
    # Each scaled on its own medium, an async save's blocking part could come out longer than the
    # whole save (here the save outran the disk's dd figure, so its bytes explain all of it).
    for key in ("blocking_s", "lost_s"):
        if key in out and "save_s" in out and out[key] > out["save_s"]:
            out[key] = out["save_s"]
            how[key] += f"; at most the whole save, {out['save_s']:.3g} s"
    return out, how


def _part(key: str) -> str:
    """`inprocess_first_step_s` → `first_step`; "" for a key of no restart path."""
    path = next((p for p in PATHS if key.startswith(p + "_")), None)
    return key[len(path) + 1:-2] if path else ""
