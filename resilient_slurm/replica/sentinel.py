"""The silent-data-corruption sentinel of one rank (monitor.sdc), called after every update.

With HSDP replicas (parallel.dp_replicate >= 2) every rank fingerprints its parameter shards
(`fingerprint.py`) and gathers its shard's fingerprints from the other replicas over the
replicate dimension of the mesh: one small all-gather, then one world-wide count of the shards
whose copies differ (over the host group, which does not wait for the device). Nothing more
happens while they agree.

When copies differ, every rank learns each dispute (an all-gather of objects, only then), and
they rule on it together: a majority of three or more copies (`verdict.rule`); for two, a third
rank re-runs the update from the state kept before it (`tie.py`). The culprit's replica group is
healed from a good one, shard by shard over the replicate dimension (`shard_heal.py`), compared again,
and the finding recorded with its node taken out (`takeout.py`). A dispute nothing can settle is
recorded and ends the attempt (`SdcUndecided`): the run restarts from its newest checkpoint.

Without replicas, `monitor.sdc.rerun_every_steps` has a buddy re-run each rank's update instead
(`buddy.py`).

The seam for replica groups that are separate jobs or process groups (per-step fault tolerance):
`compare` takes the fingerprints of this rank's shard in every replica, and healing needs a
broadcast over the ranks holding the shard; both are collectives over `self.group` here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from resilient_slurm.config import Config, Layout
from resilient_slurm.ledger import EventLog, Sdc
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.replica import buddy, roles, takeout, tie
from resilient_slurm.replica.fingerprint import fingerprints
from resilient_slurm.replica.shard_heal import broadcast_shards
from resilient_slurm.replica.holder import Holder
from resilient_slurm.replica.update_rerun import KeptState
from resilient_slurm.replica.verdict import (Dispute, Fingerprint, Opinion, Ruling, differing, finding, heal_sources,
                                             rule)
from resilient_slurm.session.distributed import Comm


class SdcUndecided(RuntimeError):
    """Copies differed and nothing could say which one is right: the attempt ends, and the run
    restarts from its newest checkpoint."""


class Sentinel:
    def __init__(self, cfg: Config, comm: Comm, layout: Layout, group: dist.ProcessGroup | None, model: nn.Module,
                 optimizer: torch.optim.Optimizer, events: EventLog, stop: StopRequest) -> None:
        s = cfg.monitor.sdc
        self.cfg, self.comm, self.layout, self.group, self.events, self.stop = cfg, comm, layout, group, events, stop
        self.replicas = layout.dp_replicate
        self.mode = "replicas" if self.replicas > 1 and s.enabled else "rerun" if s.rerun_every_steps else None
        self.every = s.every_steps if self.mode == "replicas" else s.rerun_every_steps
        named = list(model.named_parameters())
        params: list[torch.Tensor] = [p for _, p in named]
        keeps = self.mode == "rerun" or (self.mode == "replicas" and self.replicas == 2 and s.rerun_on_tie)
        self.holder = Holder(comm, [n for n, _ in named], params, optimizer,
                             KeptState(optimizer, params) if keeps else None,
                             comm.all_gather_object(comm.node) if self.mode else [])
        self.members = roles.replicas_of(layout, comm.rank)
        self.shard = self.members[0]
        self.agreed: tuple[tuple[Fingerprint, ...], int] | None = None
        """The fingerprints every replica agreed on at the last check, and its step."""

    def due(self, step: int) -> bool:
        return self.mode is not None and step % self.every == 0

    def arm(self, step: int) -> None:
        """Before step `step`: keep the state before its update when its check may need a re-run."""
        if self.holder.kept is not None and self.due(step):
            self.holder.kept.armed = True

    def check(self, step: int) -> None:
        """After step `step`'s update, on every rank; raises SdcUndecided for a dispute nobody settles."""
        if not self.due(step):
            return
        if self.mode == "replicas":
            self._compare_replicas(step)
            return
        found = buddy.check(self.holder, step)
        if found is not None:
            self._record(step, found)

    def compare(self) -> list[list[Fingerprint]]:
        """This shard's fingerprints in every replica group (rows by group)."""
        mine = fingerprints(self.holder.params).to(self.comm.device)
        rows = [torch.empty_like(mine) for _ in range(self.replicas)]
        dist.all_gather(rows, mine, group=self.group)
        return [[(int(a), int(b)) for a, b in r.tolist()] for r in rows]

    def _compare_replicas(self, step: int) -> None:
        rows = self.compare()
        disputed = differing(rows)
        if not self.comm.count(bool(disputed) and self.comm.rank == self.shard):
            self.agreed = (tuple(rows[0]), step)
            return
        found = time.perf_counter()
        mine = Dispute(self.shard, tuple(self.members), tuple(disputed),
                       {m: tuple(rows[g][i] for i in disputed) for g, m in enumerate(self.members)}) \
            if disputed and self.comm.rank == self.shard else None
        disputes: list[Dispute] = [d for d in self.comm.all_gather_object(mine) if d is not None]
        if self.replicas >= 3:
            rulings = [rule([Opinion(m, d.after[m]) for m in d.members]) for d in disputes]
            extra: list[dict[str, Any]] = []
        else:
            agreed = self.agreed[0] if self.agreed is not None and self.agreed[1] == step - 1 else None
            rulings, extra = tie.settle(self.holder, disputes, agreed)
        source, verified = None, False
        if all(r.decided for r in rulings):
            source = self._heal(disputes, rulings)
            verified = not self.comm.count(bool(differing(self.compare())) and self.comm.rank == self.shard)
        self.agreed = None
        self._record(step, finding("replicas", disputes, rulings, extra, self.holder.names, self.holder.nodes,
                                   source, time.perf_counter() - found, verified))

    def _heal(self, disputes: Sequence[Dispute], rulings: Sequence[Ruling]) -> str:
        """Every shard of a culprit's group from a good group (the whole group: its optimizer state
        is not fingerprinted, and a node that corrupted one shard may have corrupted more)."""
        group_of = {r: self.layout.coords(r).dp_replicate for r in range(self.layout.world_size)}
        by_shard, default = heal_sources([(d.shard, r) for d, r in zip(disputes, rulings)], self.replicas, group_of)
        source = by_shard.get(self.shard, default)
        if source is not None and self.group is not None:
            h = self.holder
            broadcast_shards(h.params, h.optimizer, self.members[source], self.group, self.comm.device)
        used = sorted(set(by_shard.values()) | ({default} if default is not None else set()))
        return ", ".join(f"group {g}" for g in used)

    def _record(self, step: int, found: Sdc) -> None:
        takeout.record(self.cfg, self.events, self.comm.rank, self.stop, step, found)
        if found.action != "healed":
            raise SdcUndecided(f"step {step}: copies differ in {', '.join(found.tensors[:4])}: {found.reason}")
