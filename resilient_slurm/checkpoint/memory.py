"""The memory tier: checkpoints in each node's host memory, copied to a buddy node's memory.

With `checkpoint.memory.every_steps` set, every N steps each rank's shards go to files under
`<checkpoint.memory.dir>/<experiment>/<run>/` on its own node (tmpfs: /dev/shm), in the disk tiers'
format (a step directory per save, the manifest with its per-chunk CRCs written last), so what
reads, checks and copies those works here unchanged: the save is `save.write_and_commit` with each
node's leader committing its node's directory (`nodes.Spread`, as for a node-local hot tier), the
copies to the buddy node are `buddy.replicate` over the tier's own gloo group (every file checked
against the manifest's CRC on arrival), and a resume is `spread.SpreadResume` on this root: own
node first, then buddies'. The disk tiers are untouched; a resume uses them only when no node
holds a complete memory checkpoint at least as new as theirs (`Checkpointer.resume`).

What the loop waits for. `save` agrees on the plan with the other ranks (one small all-gather
in a steady run) and plans the files (names, headers, JSON: milliseconds), and returns.
A thread of the tier's own then writes the tensors straight from their memory into the files (on
tmpfs, a copy into the page cache: the "device to host" copy of a CPU run, with the CRC of every
chunk on the way), and after that commits, copies to the buddy and prunes, at a low priority. The
tensors must not change until their bytes are out: the optimizer's next step waits for that (a
step pre-hook, `guard`), so training waits only when the copy outlasts the next step's forward and
backward. With tensors on a GPU, `save` first copies them into pinned host buffers
(`staging.Stager`): there the device-to-host copy is the blocking part, and the thread writes from
the buffers. The async disk save, by contrast, holds the loop for its whole staging copy, and in
`Checkpointer.save` for an all-reduce of the ranks' busy/failed flags (on the device with NCCL,
which waits for the queued step) and, with `if_busy=wait`, for the previous disk save.

Memory. Each node holds `keep_last` committed checkpoints and the one being written, of its own
ranks and of the ranks it keeps buddy copies of; `check_fits` compares that with the node's free
tmpfs space and MemAvailable at start and refuses the run with one line if it does not fit: a
sizing mistake that a restart cannot fix, and a tier that quietly switched itself off would change
what the run loses to each failure without anyone deciding so.

Lifetime. tmpfs outlives the training processes (a restart in the same allocation, or inside the
surviving processes, finds the files) but not the node: a reboot or a dead node loses its tier,
which is what the buddy copy and the disk tiers are for. A finished run deletes its tier
(`close(finished=True)`); a job that ends otherwise leaves it to `memory_files.clean` (the Slurm
epilog).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resilient_slurm import ledger
from resilient_slurm.checkpoint import buddy, layout, load, memory_files, store
from resilient_slurm.checkpoint.async_save import BACKGROUND_NICE
from resilient_slurm.checkpoint.group import checkpoint_group
from resilient_slurm.checkpoint.memory_policy import SOURCES, fits, node_need
from resilient_slurm.checkpoint.nodes import Spread
from resilient_slurm.checkpoint.parallel_io import OutFile
from resilient_slurm.checkpoint.safetensors_io import out_file
from resilient_slurm.checkpoint.save import SaveError, SaveResult, prepare, tmp_path, write_and_commit
from resilient_slurm.checkpoint.spread import SpreadResume
from resilient_slurm.checkpoint.staging import Stager
from resilient_slurm.checkpoint.state import Snapshot, model_tensors, optimizer_tensors, param_names
from resilient_slurm.config import CheckpointConfig
from resilient_slurm.ledger import EventLog
from resilient_slurm.checkpoint.collectives import RunCollectives
from resilient_slurm.errors import InputError


class MemoryTierTooSmall(InputError):
    """A node's memory cannot hold the tier (checked at start): change the config; a restart cannot help."""


class MemoryTier:
    """One rank's part of the tier; every rank builds it alike (it makes a process group)."""

    def __init__(self, run_dir: Path, cfg: CheckpointConfig, comm: RunCollectives, spread: Spread, events: EventLog | None,
                 timeout_s: float) -> None:
        self.cfg = cfg.memory
        self.max_shard_bytes, self.io_threads = cfg.max_shard_bytes, cfg.io_threads
        self.spread, self.events, self.rank = spread, events, comm.rank
        self.node = spread.nodes[comm.rank]
        self.root = memory_files.root(run_dir, self.cfg.dir, self.node)
        self.leader = spread.is_leader(comm.rank)
        # Collectives and buddy transfers from the tier's thread, apart from training's and the disk saves'.
        self.group = checkpoint_group(comm, timeout_s)
        self.stager = Stager()
        self.checked = False
        self._thread: threading.Thread | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._hook: Any = None
        if self.leader:
            memory_files.claim(self.root, run_dir)

    # --- saving
    def save(self, step: int, snap: Snapshot) -> float:
        """Start saving `snap` (every rank, at the same steps); the seconds the caller was held up,
        including any wait for the previous memory save, which must have finished first."""
        start = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - start
        try:
            files = prepare(self.root, step, snap, self.group, self.max_shard_bytes, self.spread)
        except SaveError as e:
            self._record_failure(step, str(e), time.perf_counter() - start, waited)
            return time.perf_counter() - start
        tmp = tmp_path(self.root, step)
        outs: list[OutFile]
        staged = _on_device(snap)
        if staged:
            outs = [s.out_file(str(tmp / s.rel)) for s in self.stager.stage(files.tensors)]
        else:
            outs = [out_file(str(tmp / rel), [(n, t.detach().contiguous()) for n, t in named])
                    for rel, named in files.tensors]
            self._copied.clear()
        blocking = time.perf_counter() - start
        copied_at = [time.perf_counter()]

        def copied() -> None:
            copied_at[0] = time.perf_counter()
            self._copied.set()
            # The rest (checksums of the small files, the commit, the buddy copy) yields to training.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)

        def run() -> None:
            result: SaveResult | None = None
            copy = buddy.BuddyCopy(0, 0.0, [])
            if staged:
                copied()  # the bytes are in the staging buffers already
            try:
                result = write_and_commit(self.root, step, files.plan, outs, files.blobs, self.group, self.io_threads,
                                          spread=self.spread, direct=False, written=None if staged else copied,
                                          problem=files.problem)
                committed_at = time.perf_counter()
                copy = self._replicate(result)
                problems = copy.problems + (self._retain() if self.leader else [])
                self.group.barrier()  # the leaders' pruning is done before any rank saves again
            except Exception as e:  # noqa: BLE001 - recorded; the disk tiers and older memory saves stand
                problems = [str(e) if isinstance(e, SaveError) else f"rank {self.rank}: {e.__class__.__name__}: {e}"]
                committed_at = time.perf_counter()
            finally:
                self._copied.set()
            if self.events is not None and self.rank == 0:
                self.events.emit(ledger.MemorySave(
                    path=str(result.path if result else tmp), bytes=result.nbytes if result else 0,
                    blocking_s=round(blocking, 4), waited_s=round(waited, 4), copy_s=round(copied_at[0] - start, 4),
                    seconds=round(committed_at - start, 4), buddy_bytes=copy.bytes,
                    buddy_seconds=round(copy.seconds, 4), ok=result is not None and not problems,
                    problems=problems[:10]), step)

        self._thread = threading.Thread(target=run, name=f"memory-save-{step}")
        self._thread.start()
        return blocking

    def _record_failure(self, step: int, error: str, blocking: float, waited: float) -> None:
        if self.events is not None and self.rank == 0:
            self.events.emit(ledger.MemorySave(
                path=str(tmp_path(self.root, step)), bytes=0, blocking_s=round(blocking, 4), waited_s=round(waited, 4),
                copy_s=round(blocking, 4), seconds=round(blocking, 4), buddy_bytes=0, buddy_seconds=0.0, ok=False,
                problems=[error]), step)

    def guard(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Make the optimizer's steps wait until a save's bytes are out of the tensors they change."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if optimizer is not None:
            self._hook = optimizer.register_step_pre_hook(self._fence)

    def _fence(self, *_: object) -> None:
        self._copied.wait()

    def wait(self) -> None:
        """Until the save in flight has finished (committed, copied, pruned, recorded)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _replicate(self, result: SaveResult) -> buddy.BuddyCopy:
        if len(self.spread.order) < 2:
            return buddy.BuddyCopy(0, 0.0, [])
        try:
            return buddy.replicate(self.root, result, self.spread, self.group, getattr(self.group, "group", None))
        except Exception as e:  # noqa: BLE001 - the checkpoint stands on its own nodes; say so
            return buddy.BuddyCopy(0, 0.0, [f"rank {self.rank}: buddy copy: {e.__class__.__name__}: {e}"])

    def _retain(self) -> list[str]:
        """A leader: its node keeps the newest `keep_last` committed steps and their buddy copies."""
        try:
            steps = store.list_step_dirs(self.root)
            keep = {s for s, p in steps if (p / layout.MANIFEST).is_file()}
            keep = set(sorted(keep, reverse=True)[: self.cfg.keep_last])
            for s, path in steps:
                if s not in keep:
                    store.delete(path)
            buddy.prune(self.root, keep)
        except OSError as e:
            return [f"node {self.node}: pruning the memory tier: {e.__class__.__name__}: {e}"]
        return []

    # --- start and resume
    def check_fits(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Raise MemoryTierTooSmall on every rank when some node cannot hold the tier (collective)."""
        shares = self.group.all_gather_object(state_bytes(model, optimizer))
        need = node_need(shares, self.spread, self.cfg.keep_last)[self.node]
        problem = None
        if self.leader:
            held = memory_files.held_bytes(self.root)
            problem = fits(self.node, need, memory_files.free_bytes(self.root) + held,
                           memory_files.mem_available() + held, self.cfg.dir)
        problems = [p for p in self.group.all_gather_object(problem) if p]
        self.checked = True
        if problems:
            raise MemoryTierTooSmall(problems[0])

    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None, before_step: int | None = None,
               refusal: load.Refusal | None = None, not_before: int | None = None) -> load.ResumeOutcome:
        """The newest complete memory checkpoint of a step in [not_before, before_step) (collective);
        `restored.source` is memory or buddy."""
        self.wait()
        outcome = SpreadResume(self.root, self.spread, self.group, getattr(self.group, "group", None),
                               self.io_threads).run(model, optimizer, scheduler, None, before_step, refusal, not_before)
        if outcome.restored is not None:
            outcome.restored.source = SOURCES.get(outcome.restored.source, outcome.restored.source)
        return outcome

    def close(self, finished: bool = False) -> None:
        """On every exit path; `finished`: the run is done (every rank), so its tier is deleted."""
        self.wait()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if finished:
            self.group.barrier()  # every rank of the node is done with its files
            if self.leader:
                shutil.rmtree(self.root, ignore_errors=True)
                try:
                    self.root.parent.rmdir()  # the experiment's directory, once its last run is gone
                except OSError:
                    pass


def load_newest(run_dir: Path, cfg: CheckpointConfig, comm: RunCollectives, model: nn.Module,
                optimizer: torch.optim.Optimizer | None, scheduler: torch.optim.lr_scheduler.LRScheduler | None,
                before_step: int | None = None, timeout_s: float = 300.0) -> load.Restored | None:
    """Load the newest memory-tier checkpoint of the run into (model, optimizer, scheduler): each
    node's own copy, else its buddy's; None when the nodes hold no complete one. Collective over
    `comm` (it gathers the ranks' nodes and makes the tier's process group): for survivors that
    keep their process through a restart, on the new process group."""
    spread = Spread(tuple(comm.all_gather_object(comm.node)))
    tier = MemoryTier(run_dir, cfg, comm, spread, None, timeout_s)
    try:
        return tier.resume(model, optimizer, scheduler, before_step).restored
    finally:
        tier.close()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """This rank's share of a checkpoint's bytes: its rows of the model and of the optimizer
    state; before the optimizer has state, AdamW's (two moments of every saved tensor)."""
    model_bytes = sum(h.data.numel() * h.data.element_size() for h in model_tensors(model).values())
    optim = optimizer_tensors(optimizer, param_names(model)) if optimizer is not None else {}
    if optimizer is not None and not optim:
        return 3 * model_bytes
    return model_bytes + sum(h.data.numel() * h.data.element_size() for h in optim.values())


def _on_device(snap: Snapshot) -> bool:
    return any(h.data.is_cuda for h in [*snap.model.values(), *snap.optimizer.values()])
