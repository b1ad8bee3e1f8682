import pytest

from resilient_slurm.checkpoint.deadline import MARGIN, choose_plan, grace_s


@pytest.mark.parametrize(
    "signal, warning, expected",
    [
        ("SIGUSR1", "USR1", 120.0),  # the time-limit warning: its lead time
        ("SIGUSR2", "USR1", 120.0),  # submitit's warning signal
        ("SIGTERM", "USR1", 30.0),  # preemption / scancel: GraceTime (KillWait)
        ("SIGTERM", "TERM", 30.0),  # warned by TERM: cannot tell it from a preemption, take the shorter
        (None, "USR1", None),  # stopped for another reason: no deadline known
    ],
)
def test_grace_by_signal(signal, warning, expected):
    assert grace_s(signal, warning, warning_lead_s=120.0, term_grace_s=30.0) == expected


GB = 10**9
FULL, WEIGHTS = 3 * GB, 1 * GB  # AdamW: optimizer state is twice the weights


@pytest.mark.parametrize(
    "budget_s, inflight_s, cold_bps, plan",
    [
        (None, 0.0, 1 * GB, "full+cold"),  # no deadline: everything
        (100.0, 0.0, 1 * GB, "full+cold"),  # 1.5 * (3 + 3) = 9 s fits
        (8.0, 0.0, 1 * GB, "full"),  # the cold copy does not fit: hot tier only, copied at the next start
        (8.0, 0.0, None, "full"),  # no cold tier
        (4.0, 0.0, None, "weights-only"),  # 4.5 s for the full state does not fit, 1.5 s for the weights does
        (4.0, 3.0, None, "none"),  # a save in flight must finish first: 3 + 1.5 > 4
        (1.0, 0.0, None, "none"),
    ],
)
def test_the_most_that_fits_is_chosen(budget_s, inflight_s, cold_bps, plan):
    chosen = choose_plan(budget_s, FULL, WEIGHTS, write_bytes_per_s=1 * GB, inflight_s=inflight_s,
                         cold_bytes_per_s=cold_bps)
    assert chosen.name == plan
    assert chosen.budget_s == budget_s
    if budget_s is not None and chosen.save:
        assert chosen.estimate_s <= budget_s
    assert chosen.reason


def test_weights_only_skips_the_optimizer_and_the_pre_commit_check_and_estimates_with_the_margin():
    chosen = choose_plan(4.0, FULL, WEIGHTS, 1 * GB, 0.5, None)
    assert (chosen.save, chosen.optimizer, chosen.check, chosen.cold_copy) == (True, False, False, False)
    assert chosen.estimate_s == pytest.approx(0.5 + MARGIN * 1.0)


def test_full_plans_keep_the_check():
    chosen = choose_plan(100.0, FULL, WEIGHTS, 1 * GB, 0.0, None)
    assert (chosen.optimizer, chosen.check) == (True, True)
