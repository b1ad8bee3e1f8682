"""One controller session over a study: take the lock, check the study against the command, open
the journal, run the controller until the search is done or a stop is requested, then write the
leaderboard and the plots."""

from __future__ import annotations

import signal
import time

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import LEDGER_FILE, EventLog, read_events
from resilient_slurm.process.signals import StopRequest, install_stop_handlers
from resilient_slurm.sweep import leaderboard, plots, study
from resilient_slurm.sweep.backends import Backend, LocalBackend, SlurmBackend
from resilient_slurm.sweep.cli import Plan, controller_lock
from resilient_slurm.sweep.controller import Controller
from resilient_slurm.sweep.launcher import TrialLauncher
from resilient_slurm.sweep.schedules import Asha, Pbt, Sampling
from resilient_slurm.sweep.space import grid_points


def run(plan: Plan, stop: StopRequest | None = None) -> int:
    """Exit status: DONE when the search is done, RESUME when it was stopped (run it again)."""
    cfg, s = plan.cfg, plan.cfg.sweep
    search, name, path = plan.search(), plan.name(), plan.path()
    stop = stop or install_stop_handlers((signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2))
    with controller_lock(path):
        existed = study.check_spec(path, search)
        max_steps = cfg.train.max_steps
        journal = study.open_study(path, name, s, max_steps)
        trials = plan.trials()
        if s.sampler == "grid":
            study.enqueue_grid(journal, grid_points(plan.dims)[:trials])
        log = EventLog(path / LEDGER_FILE, rank=-1)
        backend: Backend = SlurmBackend() if cfg.cluster.kind == "slurm" else LocalBackend()
        launcher = TrialLauncher(plan.base, plan.overrides, name, backend, log)
        steps = plan.pause_steps()
        schedule = (Asha(trials, steps, s.reduction_factor, s.direction) if s.scheduler == "asha"
                    else Pbt(trials, steps, plan.dims, s.quantile, s.direction, list(s.perturb_factors),
                             s.resample_probability, s.seed, cfg.checkpoint) if s.scheduler == "pbt"
                    else Sampling(trials))
        print(f"resilient_slurm: sweep {'resuming' if existed else 'starting'} {path} ({search.label()}, "
              f"{trials} trials, {s.parallel} in flight)", flush=True)
        ctl = Controller(s, max_steps, journal, study.distributions(plan.dims), path, launcher, backend, schedule,
                         stop, local=cfg.cluster.kind == "local", sleep=lambda t: _nap(t, stop))
        done = ctl.run(trials)
        gpus = cfg.cluster.gpus_per_node * cfg.cluster.nodes if cfg.cluster.kind == "slurm" else 0
        events = read_events(path / LEDGER_FILE)
        table = leaderboard.rows(list(ctl.trials.values()), s.direction, gpus, events)
        keys = [d.key for d in plan.dims]
        leaderboard.write_csv(path / "leaderboard.csv", table, keys)
        print(leaderboard.render(table, keys, s.metric), flush=True)
        try:
            plots.draw(path / "plots", journal, list(ctl.trials.values()), plan.dims, s.metric, s.direction, events,
                       s.scheduler == "pbt")
        except Exception as e:  # noqa: BLE001 - a plot must not fail a finished search; say why
            print(f"resilient_slurm: sweep: plots not drawn: {type(e).__name__}: {e}", flush=True)
    if not done:
        print(f"resilient_slurm: sweep stopped ({stop.signal_name or stop.reason}); run the same command to resume "
              f"{path}", flush=True)
        return ExitCode.RESUME
    print(f"resilient_slurm: sweep done: {path}", flush=True)
    return ExitCode.DONE


def _nap(seconds: float, stop: StopRequest) -> None:
    """Sleep, waking early for a stop request (signals do not cut a sleep short)."""
    end = time.monotonic() + seconds
    while not stop.requested and (left := end - time.monotonic()) > 0:
        time.sleep(min(0.2, left))
