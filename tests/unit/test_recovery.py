import pytest

from resilient_slurm.ledger import parse
from resilient_slurm.recovery import (
    Action,
    Failure,
    across_progress,
    classify,
    decide,
    failures_without_progress,
    micro_batch_after,
    on_findings,
    on_out_of_memory,
    restart_cause,
)

EXIT, FINISH, GIVE_UP, REQUEUE, RETRY = Action.EXIT, Action.FINISH, Action.GIVE_UP, Action.REQUEUE, Action.RETRY


def ev(event, restart, step=None, job="7", **extra):
    """A ledger line of attempt `restart` of job `job`, read back as the ledger reads it."""
    return parse({"event": event, "step": step, "job_id": job, "restart": restart, **extra})


def attempt(restart, saves=(), crash=False, stop=None):
    out = [ev("attempt", restart), ev("start", restart, 0)]
    out += [ev("save", restart, s, reason="periodic") for s in saves]
    if crash:
        out.append(ev("crash", restart, 12, error="ValueError: boom"))
    if stop:
        out += [ev("signal", restart, 30, signal=stop), ev("stop", restart, 30)]
    return out


@pytest.mark.parametrize(
    "history, expected",
    [
        ([], 0),
        (attempt(0, saves=[5, 10], crash=True), 0),  # it saved new checkpoints: progress
        (attempt(0, saves=[5, 10], crash=True) + attempt(1, crash=True), 1),
        (attempt(0, saves=[5, 10], crash=True) + attempt(1, crash=True) + attempt(2, crash=True), 2),
        # a save of a step already saved before is no progress
        (attempt(0, saves=[10], crash=True) + attempt(1, saves=[10], crash=True), 1),
        # progress in between resets the count
        (attempt(0, crash=True) + attempt(1, crash=True) + attempt(2, saves=[20], crash=True), 0),
        # a preempted attempt without progress neither counts nor resets
        (attempt(0, saves=[10], crash=True) + attempt(1, crash=True) + attempt(2, stop="SIGUSR1")
         + attempt(3, crash=True), 2),
        # events of local runs (no job id) are not attempts of this job
        ([parse({"event": "crash", "step": 3})], 0),
        # several ranks reporting one crash is one failed attempt
        (attempt(0, saves=[10], crash=True) + attempt(1, crash=True) + [ev("crash", 1, 12)], 1),
    ],
)
def test_failures_without_progress(history, expected):
    assert failures_without_progress(history) == expected


@pytest.mark.parametrize(
    "code, signal, history, budget, action, reason_part",
    [
        (0, None, [], 3, FINISH, "finished"),
        (75, "SIGUSR1", [], 3, REQUEUE, "time-limit warning or preemption"),
        (75, "SIGUSR2", [], 0, REQUEUE, "SIGUSR2"),  # never uses the budget
        (75, "SIGTERM", [], 3, EXIT, "a cancelled one stays cancelled"),
        (1, None, attempt(0, saves=[5], crash=True), 0, REQUEUE, "restart budget untouched"),
        (1, None, attempt(0, saves=[5], crash=True) + attempt(1, crash=True), 1, REQUEUE, "failure 1 without progress"),
        (1, None, attempt(0, saves=[5], crash=True) + attempt(1, crash=True), 0, GIVE_UP, "exceed the restart budget of 0"),
        (1, None, attempt(0, saves=[5], crash=True) + attempt(1, crash=True) + attempt(2, crash=True)
         + attempt(3, crash=True), 2, GIVE_UP, "3 consecutive failures"),
    ],
)
def test_decide(code, signal, history, budget, action, reason_part):
    d = decide(code, signal, "ValueError: boom\nmore lines", history, budget)
    assert d.action == action
    assert reason_part in d.reason and "\n" not in d.reason


def test_restart_cause_names_how_the_previous_attempt_ended():
    h = attempt(0, saves=[10], stop="SIGUSR1") + [ev("requeue", 0, 30, reason="SIGUSR1: time-limit warning")]
    assert restart_cause(h, ("7", 1, 0)) == "SIGUSR1: time-limit warning"
    assert restart_cause(attempt(0, stop="SIGTERM"), ("7", 1, 0)) == "stopped by SIGTERM at step 30"
    assert restart_cause(attempt(0, saves=[10]), ("7", 1, 0)).startswith("the previous attempt ended without a trace")
    assert restart_cause(attempt(0, crash=True), ("7", 1, 0)) == "crashed at step 12: ValueError: boom"
    assert restart_cause([], ("7", 0, 0)) == "first start"


def test_restart_cause_prefers_the_jobs_decision_over_later_failure_lines():
    h = attempt(0, saves=[10]) + [ev("hang", 0, 69, reason="no step completed for 5s"),
                                  ev("requeue", 0, 69, reason="requeued after a hang"),
                                  ev("crash", 0, 69, error="RuntimeError: Connection closed by peer")]
    assert restart_cause(h, ("7", 1, 0)) == "requeued after a hang"


@pytest.mark.parametrize(
    "streak, kind, node",
    [
        # the same failure after the same step, on two nodes: a code bug
        ([[Failure(11, "ValueError: x", "n1")], [Failure(11, "ValueError: x", "n2")]], "code_bug", None),
        # peers that lost the failing rank do not hide the origin
        ([[Failure(11, "ValueError: x", "n1"), Failure(11, "RuntimeError: Connection closed by peer", "n2")],
          [Failure(11, "ValueError: x", "n3"), Failure(11, "RuntimeError: gloo timeout", "n1")]], "code_bug", None),
        # different failures that follow one node: hardware
        ([[Failure(40, "RuntimeError: CUDA error: an illegal memory access", "n2")],
          [Failure(12, "RuntimeError: CUDA error: unspecified launch failure", "n2")]], "node", "n2"),
        # different failures on different nodes: nothing to conclude
        ([[Failure(40, "A", "n1")], [Failure(12, "B", "n2")]], None, None),
        # one failure is not a pattern
        ([[Failure(11, "ValueError: x", "n1")]], None, None),
        # every start fails on one node before the first step (a dead link): the node, not the code
        ([[Failure(None, "RuntimeError: NCCL error", "n4"), Failure(None, "RuntimeError: Connection closed by peer", "n5")],
          [Failure(None, "RuntimeError: NCCL error", "n4"), Failure(None, "RuntimeError: gloo timeout", "n6")]],
         "node", "n4"),
        # the same failure at the same step, always on the one node a 1-node job gets: still a bug
        ([[Failure(11, "ValueError: x", "n1")], [Failure(11, "ValueError: x", "n1")]], "code_bug", None),
    ],
)
def test_classify(streak, kind, node):
    got = classify(streak)
    assert (got.kind if got else None) == kind
    assert (got.node if got else None) == node


def test_decide_stops_a_code_bug_seen_on_two_nodes_before_the_budget_is_spent():
    h = [ev("crash", 0, 11, error="ValueError: x", node="n1"), ev("crash", 1, 11, error="ValueError: x", node="n2")]
    d = decide(1, None, "ValueError: x", h, max_restarts=5)
    assert d.action == GIVE_UP and "code bug" in d.reason and "n1, n2" in d.reason


def test_two_nodes_lost_one_after_the_other_at_the_same_step_are_not_a_code_bug():
    """Found by the simulator at the seed's scale (issue 28's scenario): a second node went down
    before the restarted run's first new step, and Slurm's same words made it a code bug."""
    lost = "srun: error: node not responding"
    h = [ev("crash", 0, 47657, error=lost, node="n918"), ev("crash", 1, 47657, error=lost, node="n1331")]
    d = decide(1, None, lost, h, max_restarts=5)
    assert d.action == REQUEUE and "code bug" not in d.reason, d


def test_decide_requeues_without_a_node_its_failures_follow():
    h = [ev("crash", 0, 40, error="CUDA error A", node="n2"), ev("crash", 1, 12, error="CUDA error B", node="n2")]
    d = decide(1, None, "CUDA error B", h, max_restarts=5)
    assert d.action == REQUEUE and d.exclude_nodes == ("n2",) and "follow node n2" in d.reason


def test_decide_requeues_without_a_node_that_failed_its_health_check_and_spends_no_budget():
    h = attempt(0, saves=[5], crash=True) + attempt(1, crash=True) + [
        ev("node_unhealthy", 1, None, bad_node="n3", reason="Xid 79: GPU has fallen off the bus")]
    d = decide(75, None, None, h, max_restarts=0)
    assert d.action == REQUEUE and d.exclude_nodes == ("n3",)
    assert "n3: Xid 79" in d.reason
    # an earlier attempt's unhealthy node does not make a later failure a node problem
    later = h + attempt(2, crash=True)
    assert decide(1, None, "boom", later, max_restarts=5).exclude_nodes == ()


@pytest.mark.parametrize(
    "kinds, done, action",
    [
        (["loss_plateau"], 0, "report"),
        (["loss_nan"], 0, "rollback"),
        (["loss_spike", "throughput_drop"], 2, "rollback"),
        (["loss_nan"], 3, "give_up"),
        ([], 0, "report"),
    ],
)
def test_on_findings(kinds, done, action):
    assert on_findings(kinds, ["loss_nan", "loss_spike"], done, 3).action == action


def test_peers_that_lost_a_failing_rank_do_not_make_a_node_fault_a_code_bug():
    """Found by the simulator: the peers' "connection closed" lines on other nodes were counted as
    nodes the failure happened on, so a node that fails at every start ended the job as a code bug."""
    h = [ev("crash", 0, None, error="RuntimeError: NCCL error", node="nX"),
         ev("crash", 0, None, error="RuntimeError: Connection closed by peer", node="nY"),
         ev("crash", 1, None, error="RuntimeError: NCCL error", node="nX"),
         ev("crash", 1, None, error="RuntimeError: Connection closed by peer", node="nZ")]
    d = decide(1, None, "RuntimeError: NCCL error", h, max_restarts=5)
    assert d.action == REQUEUE and d.exclude_nodes == ("nX",), d


PEER = "RuntimeError: Connection closed by peer"


def trained(restart, node, error="RuntimeError: ibv_poll_cq: transport retry counter exceeded", step=412):
    """An attempt that saved new checkpoints, then failed on `node` (its peer on n9 lost it)."""
    return [ev("start", restart, 0), ev("save", restart, step - 12, reason="periodic"),
            ev("crash", restart, step, error=error, node=node), ev("crash", restart, step, error=PEER, node="n9")]


def fails(restart, *nodes, error="RuntimeError: NCCL error: remote process exited", step=None):
    """An attempt that fails on `nodes` (before its first step unless `step`); a peer on n8 lost them."""
    return [ev("start", restart, 0)] + [ev("crash", restart, step, error=error, node=n) for n in nodes] + [
        ev("crash", restart, step, error=PEER, node="n8")]


BUG = "IndexError: index 4096 is out of bounds for dimension 0 with size 4096"


@pytest.mark.parametrize(
    "history, kind, node",
    [
        # it failed while training (and had saved), then its next start fails before the first step
        (trained(0, "n4") + fails(1, "n4"), "node", "n4"),
        # a hang names no origin: its node is the one it was seen on
        ([ev("start", 0, 0), ev("save", 0, 5, reason="periodic"), ev("hang", 0, 9, reason="no step", node="n4")]
         + fails(1, "n4"), "node", "n4"),
        # the start failed on two nodes, one of them the node of the failure before
        (trained(0, "n4") + fails(1, "n4", "n7"), "node", "n4"),
        # the same failure after the same step, on another node, a checkpoint in between: a bug
        (trained(0, "n4", error=BUG) + fails(1, "n6", error=BUG, step=412), "code_bug", None),
        # the start failed after a step: failures sharing a node across progress may be chance
        (trained(0, "n4") + fails(1, "n4", step=0), None, None),
        # two hangs after the same step (the one resumed from, say): a hang names no cause
        ([ev("start", 0, 0), ev("save", 0, 100, reason="periodic"), ev("hang", 0, 100, reason="no step", node="n4"),
          ev("start", 1, 0), ev("hang", 1, 100, reason="no step", node="n6")], None, None),
        # the same failure at another step
        (trained(0, "n4", error=BUG) + trained(1, "n6", error=BUG, step=500), None, None),
        # the start failed on another node than the failure before it
        (trained(0, "n4") + fails(1, "n7"), None, None),
        # both failed on the same two nodes: nothing points at one
        (trained(0, "n4") + [ev("crash", 0, 412, error="ValueError: y", node="n7")] + fails(1, "n4", "n7"),
         None, None),
        # a rank that only lost its peer is no origin, where another rank names one
        (trained(0, "n4") + fails(1, "n9", error="RuntimeError: CUDA error: initialization error"),
         None, None),
        # an attempt that ended cleanly in between: the node ran a whole attempt
        (trained(0, "n4") + attempt(1, stop="SIGUSR1") + fails(2, "n4"), None, None),
        # a first start that fails is no pair
        (fails(0, "n4"), None, None),
    ],
)
def test_across_progress(history, kind, node):
    got = across_progress(history)
    assert (got.kind if got else None, got.node if got else None) == (kind, node)


def test_decide_excludes_a_node_that_fails_the_start_after_it_failed_training():
    """Found by the simulator: a dead link failed while training; the checkpoints before that
    failure kept it out of the streak, so the node failed two more starts before it was pinned."""
    h = trained(0, "n4") + fails(1, "n4")
    d = decide(1, None, "RuntimeError: NCCL error: remote process exited", h, max_restarts=3)
    assert d.action == REQUEUE and d.exclude_nodes == ("n4",) and "follow node n4" in d.reason
    assert decide(1, None, "boom", h, max_restarts=0).action == GIVE_UP  # the budget still counts the start


def test_decide_stops_a_code_bug_at_its_second_strike_despite_a_checkpoint_in_between():
    """Found by the simulator: the checkpoints before a bug's first strike kept it out of the
    streak, so every bug struck three times before the job gave up."""
    h = trained(0, "n4", error=BUG) + fails(1, "n6", error=BUG, step=412)
    d = decide(1, None, BUG, h, max_restarts=3)
    assert d.action == GIVE_UP and "code bug" in d.reason and "n4, n6" in d.reason
    # the second attempt saved a new checkpoint of its own before the step: still the same bug
    saved = trained(0, "n4", error=BUG) + [ev("start", 1, 0), ev("save", 1, 406, reason="periodic"),
                                            ev("crash", 1, 412, error=BUG, node="n6")]
    assert decide(1, None, BUG, saved, max_restarts=3).action == GIVE_UP


@pytest.mark.parametrize(
    "phase, micro, rows, checkpointing, action, new, reason_part",
    [
        ("forward/backward", 4, 8, False, RETRY, 2, "redone at 2 (4 micro-batches per rank)"),
        ("forward/backward", 2, 8, False, RETRY, 1, "the same global batch"),
        ("forward/backward", 3, 6, False, RETRY, 1, "redone at 1"),  # 1.5 rows is no micro-batch
        ("forward/backward", 6, 12, False, RETRY, 3, "redone at 3"),
        ("forward/backward", 5, 10, False, RETRY, 2, "redone at 2"),  # the largest divisor of 10 up to 2.5
        ("forward/backward", 1, 8, False, GIVE_UP, None, "turn on activation checkpointing "
                                                         "(model.activation_checkpointing=true), shard over more ranks, "
                                                         "or shorten the sequence (data.seq_len)"),
        ("forward/backward", 1, 8, True, GIVE_UP, None, "the smallest: shard over more ranks"),
        ("optimizer", 4, 8, False, GIVE_UP, None, "the micro-batch does not change its memory"),
    ],
)
def test_on_out_of_memory(phase, micro, rows, checkpointing, action, new, reason_part):
    d = on_out_of_memory(phase, micro, rows, checkpointing)
    assert (d.action, d.micro_batch) == (action, new) and reason_part in d.reason, d


def oom_retry(restart, old, new, configured):
    return ev("oom_retry", restart, 5, ranks=[1], error="CUDA out of memory", old_micro_batch=old,
              new_micro_batch=new, configured_micro_batch=configured, accumulation=2, memory=[])


@pytest.mark.parametrize(
    "history, configured, rows, expected",
    [
        ([], 4, 8, 4),
        ([oom_retry(0, 4, 2, 4)], 4, 8, 2),
        ([oom_retry(0, 4, 2, 4), oom_retry(0, 2, 1, 4)], 4, 8, 1),  # the newest
        ([oom_retry(0, 4, 2, 4)], 8, 8, 8),  # data.micro_batch_size changed since: the user's new choice
        ([oom_retry(0, 4, 2, 4)], 4, 1, 1),  # more ranks now: one row per rank
        ([oom_retry(0, 6, 3, 6)], 6, 2, 2),  # cut to a divisor of the rank's rows
    ],
)
def test_micro_batch_after(history, configured, rows, expected):
    assert micro_batch_after(history, configured, rows) == expected


def test_decide_gives_up_at_once_on_an_out_of_memory_a_smaller_micro_batch_cannot_fix():
    reason = "out of memory in the forward/backward at micro-batch 1, the smallest: shard over more ranks"
    h = attempt(0, saves=[5]) + [ev("out_of_memory", 0, 7, phase="forward/backward", ranks=[1], error="CUDA out",
                                    micro_batch=1, memory=[], reason=reason)]
    # whatever the task's own status (a peer's "connection closed" crash included), with budget to spare
    for code in (70, 1):
        d = decide(code, None, "RuntimeError: Connection closed by peer", h, max_restarts=5)
        assert (d.action, d.reason, d.exclude_nodes) == (GIVE_UP, reason, ())


def host_oom_attempt(restart, step, node="n2", saves=()):
    """An attempt whose rank 1 on `node` the OOM killer took after `step`; its peer on n1 lost it."""
    return [ev("start", restart, 0), *[ev("save", restart, s, reason="periodic") for s in saves],
            ev("crash", restart, step, error=PEER, node="n1"),
            # recorded by a survivor on the victim's node: the one that can read its kernel log
            ev("host_oom", restart, step, killed_rank=1, pid=4242, source="kernel_log", node=node,
               evidence="Memory cgroup out of memory: Killed process 4242 (python)")]


@pytest.mark.parametrize(
    "history, budget, action, reason_part",
    [
        (host_oom_attempt(0, 40), 3, REQUEUE, "failure 1 without progress (budget 3 restarts): host out of memory: "
                                              "rank 1 (pid 4242) killed by the kernel's OOM killer; the node stays"),
        # the same step twice, even with a checkpoint in between: give up, with what to look at
        (host_oom_attempt(0, 40, saves=[30]) + host_oom_attempt(1, 40), 3, GIVE_UP,
         "after step 40 on two attempts in a row: look for a leak (memory_leak findings"),
        # other steps on the same node (a leak that grows from each start): not the node's fault
        (host_oom_attempt(0, 40) + host_oom_attempt(1, 25), 3, REQUEUE, "failure 2 without progress"),
        (host_oom_attempt(0, 40) + host_oom_attempt(1, 25), 1, GIVE_UP, "exceed the restart budget of 1"),
    ],
)
def test_decide_never_excludes_the_node_of_a_host_oom(history, budget, action, reason_part):
    d = decide(1, None, PEER, history, budget)
    assert (d.action, d.exclude_nodes) == (action, ()) and reason_part in d.reason, d
