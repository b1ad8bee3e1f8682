"""One rank's life in a run, whoever trains: the built-in trainer, or a user's `entry=` function.

The same function runs in-process (`cluster=local`, one rank), in each process of a local
multi-rank run (`python -m resilient_slurm.runtime.rank RUN_DIR`), and inside Slurm tasks; it
ends with a status that says what next (`exit_codes.ExitCode`), and never lets an exception out.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from resilient_slurm import ledger
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.config import Config
from resilient_slurm.ledger import EventLog
from resilient_slurm.rundir import RunDir
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.session.distributed import Comm, RankInfo
from resilient_slurm.session import rejoin
from resilient_slurm.session.collectives import flight_recorder_env
from resilient_slurm.session.heartbeat import Heartbeat
from resilient_slurm.session.logs import LOG_ONLY, setup_logging
from resilient_slurm.errors import exit_code_for
from resilient_slurm.session.context import RunOutcome
from resilient_slurm.process.launch import RankLaunch, mark_generation
from resilient_slurm.process.signals import StopRequest, install_stop_handlers
from resilient_slurm.process.threads import rank_threads
from resilient_slurm.session.replica_place import place_from_launch

log = logging.getLogger("resilient_slurm")


def run(
    cfg: Config, run_dir: Path, info: RankInfo | None = None, context: dict[str, Any] | None = None,
    stop: StopRequest | None = None, on_hang: Callable[[int, str], None] | None = None,
) -> RunOutcome:
    """Run rank `info` (default: from the environment) of the run in `run_dir`.

    `context` is stamped on every event this rank writes (job id, restart count, node); `stop` is
    the stop request already receiving signals, if the caller installed the handlers earlier;
    `on_hang(step, reason)` runs when the watchdog finds the loop stuck, just before the process
    ends (a Slurm task requeues the job there).
    """
    stop = stop or install_stop_handlers()
    me: RankInfo = info or RankInfo.from_env()
    if cfg.cluster.replica_ft and me.replica is None:  # this process group is one replica group's
        me = replace(me, replica=place_from_launch(RankLaunch.from_env(os.environ), cfg.parallel.dp_replicate,
                                                    me.world_size))
    if cfg.train.deterministic:
        # cuBLAS is only deterministic with a fixed workspace, and torch refuses it in deterministic
        # mode without one; set before the first matmul creates the handle. No effect on the CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    named = me.rank if me.replica is None else me.replica.global_rank(me.rank)
    # Before any process group is made: torch reads the flight recorder's settings then.
    for key, value in flight_recorder_env(cfg.monitor.flight_recorder, RunDir(run_dir).logs).items():
        os.environ.setdefault(key, value)
    events = EventLog(RunDir(run_dir).events, rank=named, context=context)
    setup_logging(run_dir, named)
    threads = rank_threads(cfg.train.threads, me.local_world_size or me.world_size)
    torch.set_num_threads(threads)
    if me.rank == 0:
        log.info("%d CPU thread(s) per rank (train.threads=%d; OMP_WAIT_POLICY=%s)", threads, cfg.train.threads,
                 os.environ.get("OMP_WAIT_POLICY", "unset"), extra=LOG_ONLY)
    if cfg.entry:
        return _guarded(lambda: _entry(cfg, run_dir, me, context or {}, stop, on_hang), events, me)
    while True:
        outcome = _guarded(lambda: _train(cfg, run_dir, me, events, stop, on_hang), events, me)
        if outcome.peer_lost is None:
            return outcome
        # A peer is gone and this rank may go on in its own process (a driven step): the driver's word.
        # First, the torn-down trainer's process groups go: reference cycles (the exception's
        # frames) hold them, and with them their gloo connections, so a survivor blocked in a
        # collective with this rank would wait for this process to exit, or for its timeout, and
        # miss the next generation's meeting. A collection ends them at once (their sockets close).
        gc.collect()
        context = dict(context or {})
        gen = rejoin.generation() + 1
        path = rejoin.instruction_path(run_dir, str(context.get("job_id")), int(context.get("restart") or 0), gen)
        events.emit(ledger.PeerLost(error=outcome.peer_lost, teardown_s=round(time.monotonic() - outcome.lost_at, 3),
                                    generation=gen), outcome.step)
        heartbeat = Heartbeat.from_env(me.rank, gen)
        word = rejoin.await_instruction(path, cfg.cluster.rejoin_timeout_s,
                                        lambda: heartbeat.beat(outcome.step or 0, "await_restart", 60.0))
        heartbeat.close()
        if word is None:
            events.emit(ledger.Crash(error=outcome.peer_lost, traceback=""), outcome.step)
            return RunOutcome(ExitCode.FAILED, outcome.step, error=outcome.peer_lost)
        mark_generation(os.environ, word.generation)
        context["job_step"] = word.job_step
        me = RankInfo(me.rank, word.world_size, me.local_rank, word.master_addr, word.master_port, me.node,
                      me.local_world_size)
        events = EventLog(RunDir(run_dir).events, rank=me.rank, context=context)
        log.info("rank %d restarts in its process (generation %d, step %d of Slurm)", me.rank, word.generation,
                 word.job_step)


def _guarded(body: Callable[[], RunOutcome], events: EventLog, info: RankInfo) -> RunOutcome:
    """`body`'s outcome; an exception it lets out recorded in the ledger and ended as an exit status."""
    try:
        return body()
    except Exception as e:  # noqa: BLE001 - recorded in the ledger, then reported by exit status
        code, error = exit_code_for(e), f"{type(e).__name__}: {e}"
        bad_input = code == ExitCode.CONFIG
        events.emit(ledger.Crash(error=error, traceback="" if bad_input else traceback.format_exc(limit=8)), None)
        if not bad_input:
            _log_crash(info.rank, e)
        elif info.rank == 0:
            print(f"resilient_slurm: {e}", file=sys.stderr, flush=True)
        return RunOutcome(code, None, error=error)


def _log_crash(rank: int, error: Exception) -> None:
    """The traceback in the rank's log; on the console too unless a peer's death caused it (the
    launcher names the rank that died, in one line)."""
    log.exception("rank %d crashed", rank, extra=LOG_ONLY if rejoin.peer_gone(error) else None)


def _entry(cfg: Config, run_dir: Path, info: RankInfo, context: dict[str, Any], stop: StopRequest,
           on_hang: Callable[[int, str], None] | None) -> RunOutcome:
    from resilient_slurm.runtime.entry import run_entry

    return run_entry(cfg, run_dir, info, context, stop, on_hang)


def _train(cfg: Config, run_dir: Path, info: RankInfo, events: EventLog, stop: StopRequest,
           on_hang: Callable[[int, str], None] | None) -> RunOutcome:
    """The built-in trainer; a crash is recorded at the step it happened. In a driven step that lets
    survivors restart in their processes, a peer's death is not this rank's crash: the outcome says
    so (`peer_lost`), after the trainer and the process group are torn down."""
    from resilient_slurm.trainer.trainer import Trainer

    comm: Comm | None = None
    trainer: Trainer | None = None
    code = ExitCode.FAILED
    try:
        comm = Comm(info, cfg.cluster.backend, cfg.cluster.collective_timeout_s)
        trainer = Trainer(cfg, run_dir, comm, events, stop, on_hang)
        code = trainer.run()
        return RunOutcome(code, trainer.step, stop.signal_name if code == ExitCode.RESUME else None,
                          error=trainer.gave_up)
    except Exception as e:  # noqa: BLE001 - recorded with its step, then reported by exit status
        code = exit_code_for(e)
        if code == ExitCode.CONFIG:
            raise  # bad input: `_guarded` says so in one line
        error = f"{type(e).__name__}: {e}"
        step = trainer.step if trainer is not None else None
        if RankLaunch.from_env(os.environ).rejoin and rejoin.peer_gone(e):
            log.warning("rank %d: a peer is gone (%s); waiting for the driver", info.rank, error[:200])
            return RunOutcome(ExitCode.FAILED, step, error=error, peer_lost=error, lost_at=time.monotonic())
        if trainer is None:
            raise
        events.emit(ledger.Crash(error=error, traceback=traceback.format_exc(limit=8)), step)
        _log_crash(info.rank, e)
        return RunOutcome(ExitCode.FAILED, step, error=error)
    finally:
        if trainer is not None:
            trainer.session.close(code)
            if trainer.replicas is not None:
                trainer.replicas.close()
        if comm is not None:
            comm.close()


def main(argv: list[str]) -> int:
    """`python -m resilient_slurm.runtime.rank RUN_DIR`: one rank of an already-prepared run."""
    if len(argv) != 1:
        print("usage: python -m resilient_slurm.runtime.rank RUN_DIR", file=sys.stderr)
        return ExitCode.CONFIG
    run_dir = Path(argv[0])
    return int(run(load_config(run_dir), run_dir).code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
