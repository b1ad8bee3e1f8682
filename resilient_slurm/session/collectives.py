"""What this rank's collectives are doing, for its heartbeat: each process group's sequence number,
and how long the training thread has waited in collectives.

**Sequence numbers.** Every process group counts the collectives issued on it
(`ProcessGroup._get_sequence_number_for_group()`, gloo and NCCL alike, FSDP2's own all-gathers and
reduce-scatters included: they go through the group). The count rises when a collective is issued,
so a rank that waits in collective N of a group reports N, and a peer that never got there reports
less: the monitor names it (`monitor.heartbeats.wavefront`). Read from the heartbeat's own thread
while the training thread is blocked in the collective. Every group this process made is read
(torch keeps them in `distributed_c10d._world.pg_names`), named as torch names it: the same name on
every rank, since every rank creates the groups in the same order.

**Waits.** `Work.wait()` is where the training thread blocks until its peers arrive: the blocking
collectives of `torch.distributed` wait there, and FSDP2 waits there for its all-gathers and
reduce-scatters. Timed on the training thread only (the checkpointer's background saves have
collectives of their own), it gives the step's collective-wait section: the time this rank spent
waiting for slower peers, which is not its own compute (`sections.py`). On NCCL, `wait()` only makes
the compute stream wait, so the CPU does not block there and the wait shows in the step's device
synchronisations instead; a GPU's compute is measured with CUDA events or CUPTI (NVRx's straggler
detection), which this CPU-side clock does not do.

**Flight recorder.** PyTorch records the newest collectives of each group in a ring buffer (for
gloo and NCCL) when `TORCH_FR_BUFFER_SIZE` is set (it replaces `TORCH_NCCL_TRACE_BUFFER_SIZE`, which
torch 2.13 calls deprecated); NCCL dumps it by itself when its watchdog times a
collective out (`TORCH_NCCL_DUMP_ON_TIMEOUT`), to `TORCH_FR_DUMP_TEMP_FILE` + the rank. The ranks'
watchdogs dump it beside their stacks when the monitor finds a hang (`dump_flight_recorder`).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


class _Clock:
    def __init__(self) -> None:
        self.thread: int | None = None
        self.waited_s = 0.0
        self.since: float | None = None


_clock = _Clock()
_original_wait: Any = None


def install(thread: int | None = None) -> None:
    """Time `Work.wait()` on `thread` (default: the calling one, the training thread) from now on.
    Once per process; a later call only moves the clock to another thread."""
    global _original_wait
    _clock.thread = threading.get_ident() if thread is None else thread
    if _original_wait is not None:
        return
    _original_wait = dist.Work.wait

    def timed_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != _clock.thread or _clock.since is not None:
            return _original_wait(work, *args, **kwargs)
        _clock.since = time.monotonic()
        try:
            return _original_wait(work, *args, **kwargs)
        finally:
            _clock.waited_s += time.monotonic() - _clock.since
            _clock.since = None

    dist.Work.wait = timed_wait  # type: ignore[method-assign,assignment]


def waited_s() -> float:
    """Seconds the training thread has spent in `Work.wait()` since the process began (a wait in
    progress included)."""
    since = _clock.since
    return _clock.waited_s + (time.monotonic() - since if since is not None else 0.0)


def waiting_s() -> float | None:
    """How long the training thread has been in the wait it is in now; None: it is not in one."""
    since = _clock.since
    return None if since is None else time.monotonic() - since


def sequences() -> tuple[tuple[str, str, int], ...]:
    """(group name, its description, the sequence number of its newest collective) for every process
    group of this process; empty before there is one. Never raises: the heartbeat must not fail."""
    if not dist.is_available() or not dist.is_initialized():
        return ()
    try:
        groups = list(dist.distributed_c10d._world.pg_names.items())
    except (AttributeError, RuntimeError):  # another torch's private layout, or a group made meanwhile
        return ()
    out = []
    for group, name in groups:
        try:
            seq = getattr(group, "_get_sequence_number_for_group")()  # bound in C++, not in torch's stubs
            out.append((str(name), str(group.group_desc), int(seq)))
        except (RuntimeError, AttributeError):  # a group torn down meanwhile
            continue
    return tuple(sorted(out))


def flight_recorder_env(entries: int, logs: Path) -> dict[str, str]:
    """The environment that turns PyTorch's flight recorder on before the process groups are made:
    `entries` collectives kept per rank, NCCL's own dump on a collective timeout into `logs`. Pure."""
    if entries <= 0:
        return {}
    return {"TORCH_FR_BUFFER_SIZE": str(entries), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(logs / "flight-recorder-rank")}


def dump_flight_recorder(path: Path) -> bool:
    """This rank's flight-recorder entries as JSON at `path`; False when it records none (off, or
    no collective yet). Never raises: it runs while the rank is being found hung."""
    try:
        trace = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json")(True, False)
        text = trace.decode() if isinstance(trace, bytes) else str(trace)
        if not json.loads(text).get("entries"):
            return False
        path.write_text(text)
    except (AttributeError, RuntimeError, ValueError, OSError):
        return False
    return True
