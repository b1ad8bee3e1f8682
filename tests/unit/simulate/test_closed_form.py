"""With exponential failures, fixed costs and nothing else going on, the simulated goodput matches
Young-Daly's first-order waste, C/tau + tau/(2M) + R/M, within one point.

The grid stays where a first-order formula holds (total waste up to ~15%): beyond it the
second-order terms (a save also extends the cycle; no failure strikes while restarting) reach a
point on their own. Each case runs enough failures (hundreds) that the run-to-run spread is a
fraction of a point.
"""

import math
import statistics
from dataclasses import replace

import pytest

from resilient_slurm.simulate.engine import Run
from resilient_slurm.simulate.failures import Fault
from resilient_slurm.simulate.results import outcome, simulate
from resilient_slurm.simulate.scenario import STRATEGIES, Scenario

TRANSIENT = (Fault("transient", "software", 1.0, "RuntimeError: transient fault"),)
FAILURES = {3: 900, 8: 500, 24: 250}


def scenario(mtbf_h: float, save_s: float, restart_s: float) -> Scenario:
    """Only transient faults, a sync save of `save_s`, a restart of exactly `restart_s`; a budget
    that never runs out and steps so short that no two failures share one (which the crash-loop
    guard would call a code bug)."""
    gpus = 1000
    return Scenario(gpus=gpus, gpus_per_node=8, days=FAILURES[mtbf_h] * mtbf_h / 24, gpu_mtbf_h=mtbf_h * gpus,
                    save_s=save_s, restart_s=restart_s, load_s=0, cold_load_s=0, cold_copy_s=0, queue_min_s=0,
                    queue_max_s=0, cred_delay_s=0, backfill_s=0, hang_detect_s=0, step_s=1e-3, max_restarts=10**9,
                    faults=TRANSIENT, mtbf_prior_h=mtbf_h, min_interval_s=1.0, max_interval_s=1e9)


def first_order_goodput(tau: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    return 1 - (save_s / tau + tau / (2 * mtbf_s) + restart_s / mtbf_s)


@pytest.mark.parametrize("mtbf_h", [3, 8, 24])
@pytest.mark.parametrize("save_s", [10.0, 60.0])
@pytest.mark.parametrize("restart_s", [60.0, 300.0])
def test_fixed_interval_matches_the_first_order_waste(mtbf_h, save_s, restart_s):
    m = mtbf_h * 3600.0
    for tau in (math.sqrt(2 * save_s * m), 2 * math.sqrt(2 * save_s * m)):  # at the optimum and off it
        s = replace(scenario(mtbf_h, save_s, restart_s), interval_min=tau / 60)
        summary, _ = simulate(s, STRATEGIES["fixed"], seeds=1)
        assert summary.goodput == pytest.approx(first_order_goodput(tau, save_s, restart_s, m), abs=0.01)


@pytest.mark.parametrize("mtbf_h, save_s, restart_s", [(3, 60.0, 300.0), (8, 10.0, 60.0), (24, 60.0, 300.0)])
def test_the_projects_young_daly_interval_reaches_the_optimum(mtbf_h, save_s, restart_s):
    """The interval comes from checkpoint.interval, fed with the measured save cost and the
    failures the run has seen: it ends at sqrt(2 C M) for the M observed (which is within a few
    percent of the true one over a few hundred failures), and the goodput is the optimum's."""
    m = mtbf_h * 3600.0
    run = Run(scenario(mtbf_h, save_s, restart_s), STRATEGIES["young_daly"], 0).run()
    seen = run.ledger.failure_history(run.t)
    assert run.intervals[-1] == pytest.approx(math.sqrt(2 * save_s * seen.exposure_s / seen.failures), rel=0.01)
    assert statistics.fmean(run.intervals) == pytest.approx(math.sqrt(2 * save_s * m), rel=0.1)
    optimum = math.sqrt(2 * save_s * m)
    assert outcome(run, 0).goodput == pytest.approx(first_order_goodput(optimum, save_s, restart_s, m), abs=0.01)
