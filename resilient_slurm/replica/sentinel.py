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

With replica groups (cluster.replica_ft) each group is a process group of its own: the same
check runs over the replica engine's sum instead of the mesh's replicate dimension
(`across_groups.py`), over the groups live at that step. Two live groups settle a tie by both
re-running the update in place from the kept state (no third rank shares their shard's process
group); the culprit's group is healed from a good one, and training goes on. Its node is drained
and excluded as below; the step is not stopped (that would stop every group, which replica groups
exist to avoid): with monitor.sdc.leave_node the job's driver moves that group alone to a spare
(`supervise/replica_driver.py`), and without a spare the next start leaves the node out.

Without replicas, `monitor.sdc.rerun_every_steps` has a buddy re-run each rank's update instead
(`buddy.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from resilient_slurm.config import Config, Layout
from resilient_slurm.ledger import EventLog, Sdc
from resilient_slurm.process.signals import StopRequest
from resilient_slurm.replica import across_groups, buddy, roles, takeout, tie
from resilient_slurm.replica.engine import Replicas
from resilient_slurm.replica.fingerprint import fingerprints
from resilient_slurm.replica.shard_heal import broadcast_shards
from resilient_slurm.replica.holder import Holder
from resilient_slurm.replica.update_rerun import KeptState
from resilient_slurm.replica.verdict import (EVIDENCE_TENSORS, UNDECIDED, Dispute, Fingerprint, Opinion, Ruling,
                                             TieFacts, as_hex, differing, finding, heal_sources, rule, settle_tie)
from resilient_slurm.session.distributed import Comm

log = logging.getLogger("resilient_slurm")


class SdcUndecided(RuntimeError):
    """Copies differed and nothing could say which one is right: the attempt ends, and the run
    restarts from its newest checkpoint."""


class Sentinel:
    def __init__(self, cfg: Config, comm: Comm, layout: Layout, group: dist.ProcessGroup | None, model: nn.Module,
                 optimizer: torch.optim.Optimizer, events: EventLog, stop: StopRequest,
                 engine: Replicas | None = None, writes: Callable[[], bool] | None = None) -> None:
        """`engine`, `writes`: with replica groups, the engine their copies meet through, and
        whether this rank writes the run's records at the moment (rank 0 of the lowest live group)."""
        s = cfg.monitor.sdc
        self.cfg, self.comm, self.layout, self.group, self.events, self.stop = cfg, comm, layout, group, events, stop
        self.engine, self.writes = engine, writes
        self.replicas = engine.place.groups if engine is not None else layout.dp_replicate
        self.mode = ("groups" if engine is not None else "replicas") if self.replicas > 1 and s.enabled \
            else "rerun" if s.rerun_every_steps else None
        self.every = s.every_steps if self.mode in ("replicas", "groups") else s.rerun_every_steps
        named = list(model.named_parameters())
        params: list[torch.Tensor] = [p for _, p in named]
        # With three or more groups, a tie while one is away is undecided (no copy kept for it).
        keeps = self.mode == "rerun" or (self.mode in ("replicas", "groups") and self.replicas == 2 and s.rerun_on_tie)
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
        if self.mode == "groups":
            self._compare_groups(step)
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

    def _compare_groups(self, step: int) -> None:
        """The check across replica groups: the same steps as `_compare_replicas`, over the engine."""
        assert self.engine is not None
        engine, place, h = self.engine, self.engine.place, self.holder
        rows = across_groups.fingerprints_by_group(engine, place, h.params, self.comm.device)
        if rows is None:
            self._gave_up(step)
            return
        live = sorted(rows)
        disputed = differing([rows[g] for g in live])
        if not self.comm.count(bool(disputed)) or len(live) < 2:
            self.agreed = (tuple(rows[live[0]]), step)
            return
        found = time.perf_counter()
        members = tuple(g * place.group_size + self.comm.rank for g in live)  # this shard's copies, by group
        mine = Dispute(members[0], members, tuple(disputed),
                       {m: tuple(rows[g][i] for i in disputed) for g, m in zip(live, members)}) if disputed else None
        settled = self._settle_groups(mine, step) if len(live) == 2 else \
            None if mine is None else (rule([Opinion(m, mine.after[m]) for m in mine.members]), [])
        nodes = across_groups.nodes_by_rank(engine, place, self.comm)
        everyone = self.comm.all_gather_object((mine, settled))
        if nodes is None or any(d is not None and r is None for d, r in everyone):
            self._gave_up(step)
            return
        disputes = [d for d, _ in everyone if d is not None]
        rulings = [r[0] for d, r in everyone if d is not None]
        extra = [x for d, r in everyone if d is not None for x in r[1]]
        source, verified = None, False
        blamed = {r // place.group_size for ruling in rulings for r in ruling.culprits}
        good = [g for g in live if g not in blamed]
        if not good:  # each group holds some culprit (several flips at once): none to heal from
            rulings = [Ruling((), (), UNDECIDED, "every live replica group holds a culprit") for _ in rulings]
        if all(r.decided for r in rulings):
            moved = across_groups.copy_group(engine, place, h.params, h.optimizer, good[0], blamed, self.comm.device)
            after = None if moved is None else across_groups.fingerprints_by_group(engine, place, h.params,
                                                                                   self.comm.device)
            if after is None:
                self._gave_up(step)
                return
            source = f"group {good[0]}"
            verified = not self.comm.count(bool(differing([after[g] for g in live])))
        self.agreed = None
        self._record(step, finding("replicas", disputes, rulings, extra, h.names, nodes, source,
                                   time.perf_counter() - found, verified, group_size=place.group_size))

    def _settle_groups(self, mine: Dispute | None, step: int) -> tuple[Ruling, list[dict[str, Any]]] | None:
        """Two live groups: both re-run the disputed update in place from the kept state, and the
        copy that differs from what both re-ran alike is the culprit (`verdict.settle_tie`). Every
        rank with a dispute calls it, and so does its copy in the other group (the same dispute)."""
        if mine is None:
            return None
        assert self.engine is not None
        engine, place = self.engine, self.engine.place
        h, a, b = self.holder, mine.members[0], mine.members[1]
        agreed = self.agreed[0] if self.agreed is not None and self.agreed[1] == step - 1 else None
        before_agreed = None if agreed is None else tuple(agreed[t] for t in mine.tensors)
        if h.kept is None:
            return settle_tie(TieFacts(a, b, mine.after, None, before_agreed, {}, ())), []
        before, grads = h.before(mine.tensors), h.grads(mine.tensors)
        k = len(mine.tensors)
        facts = torch.tensor([*h.rows([x.param for x in before]),
                              *h.rows([g if g is not None else torch.empty(0) for g in grads]),
                              *h.rows([x.param for x in h.rerun(list(zip(before, grads)))])], dtype=torch.int64)
        got = across_groups.by_group(engine, place, facts.to(self.comm.device))
        if got is None or len(got) != 2:
            return None
        of = {g * place.group_size + self.comm.rank: across_groups.as_rows(v) for g, v in got.items()}
        reruns = [Opinion(r, tuple(of[r][2 * k:]), rerun_of=r) for r in (a, b)]
        ruling = settle_tie(TieFacts(a, b, mine.after, {r: tuple(of[r][:k]) for r in (a, b)}, before_agreed,
                                     {r: tuple(of[r][k:2 * k]) for r in (a, b)}, reruns))
        extra = [{"rank": o.rank, "node": None, "rerun_of": o.rerun_of, "tensor": h.names[t],
                  "fingerprint": as_hex(fp)}
                 for o in reruns for t, fp in list(zip(mine.tensors, o.fingerprints))[:EVIDENCE_TENSORS]]
        return ruling, extra

    def _gave_up(self, step: int) -> None:
        """A group failed during the check: the next quorum goes on without it, unchecked this step."""
        self.agreed = None
        log.warning("step %d: the silent-data-corruption check across replica groups was cut short by a group's "
                    "failure; the next step's check compares the groups that are left", step)

    def _record(self, step: int, found: Sdc) -> None:
        writes = self.comm.rank == 0 if self.writes is None else self.writes()
        takeout.record(self.cfg, self.events, writes, self.stop, step, found, leave=self.mode != "groups")
        if found.action != "healed":
            raise SdcUndecided(f"step {step}: copies differ in {', '.join(found.tensors[:4])}: {found.reason}")
