"""What the controller launches next, for each kind of search: plain sampling (grid, random, TPE,
with or without a pruner), ASHA and PBT. The decisions themselves are pure (asha.py, pbt.py); these
apply them: record the decision in the study's ledger, then carry it out.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from resilient_slurm.rundir import RunDir
from resilient_slurm.config import CheckpointConfig
from resilient_slurm.launch.prepare import AllowedChange
from resilient_slurm.ledger import EventLog, Exploit, Explore, PbtGeneration, TrialPromoted, read_events
from resilient_slurm.sweep import asha, pbt
from resilient_slurm.sweep.exploit import ExploitError, copy_checkpoint
from resilient_slurm.sweep.feed import ranked, value_at
from resilient_slurm.sweep.replay import CopyIntent, Status
from resilient_slurm.sweep.space import Dimension

if TYPE_CHECKING:
    from resilient_slurm.sweep.controller import Controller, TrialRun


class Sampling:
    """Trials run to train.max_steps unless the pruner stops them; `trials` of them."""

    def __init__(self, trials: int) -> None:
        self.trials = trials

    def first_target(self, ctl: Controller) -> int:
        return ctl.max_steps

    def next_steps(self, ctl: Controller) -> dict[int, int]:
        return {}

    def fill(self, ctl: Controller) -> None:
        _launch_pending(ctl)
        while ctl.free_slots() > 0 and ctl.asked() < self.trials and ctl.budget_allows(ctl.max_steps):
            ctl.start(ctl.ask(ctl.max_steps))

    def done(self, ctl: Controller) -> bool:
        idle = not ctl.in_flight() and not ctl.with_status(Status.PENDING)
        return idle and (ctl.asked() >= self.trials or not ctl.budget_allows(ctl.max_steps))

    def finish(self, ctl: Controller) -> None:
        pass


class Asha:
    def __init__(self, trials: int, rungs: tuple[int, ...], eta: int, direction: str) -> None:
        self.trials, self.rungs, self.eta, self.direction = trials, rungs, eta, direction

    def first_target(self, ctl: Controller) -> int:
        return self.rungs[0]

    def next_steps(self, ctl: Controller) -> dict[int, int]:
        return {}

    def _promotion(self, ctl: Controller) -> asha.Promotion | None:
        results: dict[int, dict[int, float]] = {}
        for t in ctl.trials.values():
            if t.status is not Status.DONE or t.result == "complete":
                results[t.number] = {k: v for k, step in enumerate(self.rungs)
                                     if step <= t.reached and (v := value_at(t.reported, step)) is not None}
        paused = {t.number: self.rungs.index(t.paused_at) for t in ctl.with_status(Status.PAUSED)
                  if t.paused_at in self.rungs}
        p = asha.promotion(results, paused, self.eta, self.direction, len(self.rungs) - 1)
        if p is None or not ctl.budget_allows(self.rungs[p.rung + 1] - self.rungs[p.rung]):
            return None
        return p

    def fill(self, ctl: Controller) -> None:
        _launch_pending(ctl)
        while ctl.free_slots() > 0:
            p = self._promotion(ctl)
            if p is not None:
                t = ctl.trials[p.trial]
                target = self.rungs[p.rung + 1]
                ctl.log.emit(TrialPromoted(trial=t.number, run=t.run, rung=p.rung, value=p.value, target_step=target),
                             t.paused_at)
                t.status, t.target, t.why = Status.PENDING, target, f"promoted from rung {p.rung}"
                ctl.start(t)
            elif ctl.asked() < self.trials and ctl.budget_allows(self.rungs[0]):
                ctl.start(ctl.ask(self.rungs[0]))
            else:
                return

    def done(self, ctl: Controller) -> bool:
        idle = not ctl.in_flight() and not ctl.with_status(Status.PENDING)
        more = ctl.asked() < self.trials and ctl.budget_allows(self.rungs[0])
        return idle and not more and self._promotion(ctl) is None

    def finish(self, ctl: Controller) -> None:
        """Trials left at a rung were stopped early: pruned, with the rung they stopped at."""
        for t in ctl.with_status(Status.PAUSED):
            ctl.prune(t, t.paused_at or t.step, f"ASHA: not promoted from rung {self.rungs.index(t.paused_at)} "
                      f"(step {t.paused_at})" if t.paused_at in self.rungs else "ASHA: not promoted")


class Pbt:
    def __init__(self, population: int, steps: tuple[int, ...], dims: list[Dimension], quantile: float,
                 direction: str, factors: list[float], resample_probability: float, seed: int,
                 checkpoint: CheckpointConfig) -> None:
        self.population, self.steps, self.dims = population, steps, dims
        self.quantile, self.direction, self.factors = quantile, direction, factors
        self.resample_probability, self.seed, self.checkpoint = resample_probability, seed, checkpoint

    def first_target(self, ctl: Controller) -> int:
        return self.steps[0]

    def next_steps(self, ctl: Controller) -> dict[int, int]:
        return dict(zip(self.steps, self.steps[1:]))

    def fill(self, ctl: Controller) -> None:
        for t in ctl.with_status(Status.PENDING):
            if ctl.free_slots() > 0:
                self._continue(ctl, t)
        while ctl.free_slots() > 0 and ctl.asked() < self.population:
            ctl.start(ctl.ask(self.steps[0]))
        members = [t for t in ctl.trials.values() if t.status is not Status.DONE]
        at = {t.paused_at for t in members}
        if ctl.asked() == self.population and members and all(t.status is Status.PAUSED for t in members) \
                and len(at) == 1:
            self._generation(ctl, members, at.pop() or 0)
            self.fill(ctl)

    def _generation(self, ctl: Controller, members: list[TrialRun], step: int) -> None:
        """Exploit and explore, decided from the scores at `step` and recorded before applying."""
        generation = self.steps.index(step) + 1
        scores = {t.number: v for t in members if (v := value_at(t.reported, step)) is not None}
        rng = random.Random(f"{self.seed}-{generation}")
        decided = pbt.decide(scores, {t.number: t.params for t in members}, self.dims, self.quantile,
                             self.direction, self.factors, self.resample_probability, rng) if len(scores) > 1 else []
        ctl.log.emit(PbtGeneration(generation=generation,
                                   scores=[[n, scores.get(n)] for n in ranked(scores, self.direction)
                                           + sorted(t.number for t in members if t.number not in scores)],
                                   exploits=[{"recipient": x.recipient, "donor": x.donor, "params": x.params,
                                              "how": x.how} for x in decided]), step)
        target = self.steps[generation]
        for t in members:
            t.status, t.target, t.why = Status.PENDING, target, f"generation {generation + 1}"
        for x in decided:
            t = ctl.trials[x.recipient]
            t.params, t.copy = dict(x.params), CopyIntent(generation, x.donor, step, x.how)

    def _continue(self, ctl: Controller, t: TrialRun) -> None:
        """Launch a member into its next generation, first copying its donor's checkpoint if it has one."""
        allow = None
        if t.copy is not None:
            donor = ctl.trials[t.copy.donor]
            if not _exploited(t, t.copy.generation):
                try:
                    source, dest = copy_checkpoint(donor.run_dir, self.checkpoint, t.run_dir, self.checkpoint,
                                                   t.copy.step)
                except ExploitError as e:
                    ctl.fail(t, f"PBT exploit of {donor.run}: {e}")
                    return
                lineage = Exploit(generation=t.copy.generation, recipient=t.run, donor=donor.run,
                                  recipient_trial=t.number, donor_trial=donor.number, source=str(source),
                                  checkpoint=str(dest))
                for log in (ctl.log, EventLog(RunDir(t.run_dir).events, rank=-1),
                            EventLog(RunDir(donor.run_dir).events, rank=-1)):
                    log.emit(lineage, t.copy.step)
            changed = {d.key: [donor.params.get(d.key), t.params.get(d.key)] for d in self.dims}
            ctl.log.emit(Explore(trial=t.number, run=t.run, changed=changed, how=dict(t.copy.how)), t.copy.step)
            allow = AllowedChange(frozenset(d.key for d in self.dims),
                                  f"PBT generation {t.copy.generation}: continues from {donor.run}'s checkpoint at "
                                  f"step {t.copy.step} with explored values")
        ctl.start(t, allow)

    def done(self, ctl: Controller) -> bool:
        return ctl.asked() == self.population and all(t.status is Status.DONE for t in ctl.trials.values())

    def finish(self, ctl: Controller) -> None:
        pass


def _launch_pending(ctl: Controller) -> None:
    for t in ctl.with_status(Status.PENDING):
        if ctl.free_slots() <= 0:
            return
        ctl.start(t)


def _exploited(t: TrialRun, generation: int) -> bool:
    """The copy was made already (a controller killed after it, before the launch)."""
    return any(isinstance(e.details, Exploit) and e.details.generation == generation and e.details.recipient == t.run
               for e in read_events(RunDir(t.run_dir).events))
