"""A driven job step: its srun command line, srun's reports, and how the driver reads a step's end
from the ledger its tasks wrote and those reports (the lines are srun 22.05's, as seen on the
sandbox cluster)."""

import pytest

from resilient_slurm.config import ClusterConfig, ElasticConfig
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.launch.submit import executor_parameters
from resilient_slurm.ledger import parse
from resilient_slurm.slurm.placement import initial
from resilient_slurm.process.launch import RankLaunch
from resilient_slurm.slurm.srun import TaskReport, parse_report, parse_step_id, step_argv
from resilient_slurm.slurm.step_end import judge, task_rank


def test_a_step_runs_on_exactly_its_nodes_and_ends_at_the_first_bad_exit():
    told = RankLaunch(run_dir="/runs/a,b", heartbeat="n1:5000", driven=True)
    argv = step_argv(("n1", "n3"), 4, ["python", "-m", "x"], cpus_per_task=8, gpus_per_node=4, extra=["--mpi=none"],
                     env=told.exports())
    assert "--nodelist=n1,n3" in argv and "--nodes=2" in argv and "--ntasks=8" in argv
    assert "--ntasks-per-node=4" in argv and "--kill-on-bad-exit=1" in argv
    assert "--cpus-per-task=8" in argv and "--gpus-per-node=4" in argv
    (export,) = [a for a in argv if a.startswith("--export=")]
    # What the driver tells every task, each variable spelled (none leaks from the driver's own
    # environment); the rank comes from Slurm and the run directory from the command line.
    entries = dict(e.split("=", 1) for e in export.removeprefix("--export=ALL,").split(","))
    assert RankLaunch.from_env(entries) == RankLaunch(heartbeat="n1:5000", driven=True)
    assert set(entries) == set(RankLaunch.names()) - {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                      "MASTER_ADDR", "MASTER_PORT", RankLaunch.variable("run_dir")}
    assert argv[0] == "srun" and "-v" in argv  # -v: srun names the step it creates
    assert argv[-4:] == ["--mpi=none", "python", "-m", "x"]
    assert not any(a.startswith("--cpus-per-task") for a in step_argv(("n1",), 1, ["x"]))
    # a rank started anew beside its node's survivors shares what their step holds
    assert "--overlap" in step_argv(("n1",), 1, ["x"], overlap=True) and "--overlap" not in argv


@pytest.mark.parametrize(
    "line, report",
    [
        ("srun: error: n2: task 1: Killed", TaskReport("n2", (1,), "Killed")),
        ("srun: error: n1: tasks 0-1,4: Exited with exit code 1\n", TaskReport("n1", (0, 1, 4), "Exited with exit code 1")),
        ("srun: error: n1: task 0: Terminated", TaskReport("n1", (0,), "Terminated")),
        ("srun: error: Node failure on gpu07", TaskReport("gpu07", (), "node failure")),
        ("srun: launch/slurm: _step_signal: Terminating StepId=74.0", None),
        ("12:08:36 [rank 0] step 50/200 | loss 4.3", None),
    ],
)
def test_srun_reports(line, report):
    assert parse_report(line) == report


def test_the_step_id_comes_from_sruns_launch_line():
    assert parse_step_id("srun: launching StepId=71.3 on host n2, 1 tasks: 1") == 3
    assert parse_step_id("srun: jobid 71: nodes(3):`n[1-3]', cpu counts: 1(x3)") is None


def ev(kind, rank=0, step=None, node="n1", **fields):
    return parse({"event": kind, "rank": rank, "step": step, "job_id": "7", "restart": 0, "job_step": 1,
                  "node": node, **fields})


def test_a_task_killed_without_a_trace_is_lost_and_its_peer_is_not():
    peer = ev("crash", 0, 69, error="RuntimeError: Connection reset by peer", traceback="")
    reports = [TaskReport("n2", (1,), "Killed")]
    end = judge([ev("start", 0, 0), peer], reports)
    assert end.code is ExitCode.FAILED and [(x.node, x.rank) for x in end.lost] == [("n2", 1)]
    assert end.error.startswith("TaskLost: task 1 on n2 ended without a trace (Killed)")
    # the same task having written its own crash first is a crash, not a loss
    own = ev("crash", 1, 69, node="n2", error="ValueError: bad batch", traceback="")
    end = judge([peer, own], reports)
    assert end.code is ExitCode.FAILED and not end.lost and end.error == "ValueError: bad batch"


def test_a_crash_that_exits_with_a_status_names_the_first_origin_failure():
    events = [ev("crash", 0, 12, error="RuntimeError: gloo connection closed by peer", traceback=""),
              ev("crash", 1, 12, node="n2", error="InjectedFault: injected failure at step 12", traceback="")]
    end = judge(events, [TaskReport("n2", (1,), "Exited with exit code 1")])
    assert end.code is ExitCode.FAILED and not end.lost and end.error.startswith("InjectedFault")


def test_a_replacement_steps_task_is_the_rank_it_replaced():
    """A replacement step's one task is task 0 to srun: on n2 of (n1, n2) at 2 tasks a node, that
    is rank 2 (task 1 there: rank 3). Its own crash trace makes it traced, not a second failure."""
    own = ev("crash", 3, 34, node="n2", error="InjectedFault: injected failure at step 35", traceback="")
    report = [TaskReport("n2", (1,), "Exited with exit code 1")]
    end = judge([own], report, ("n1", "n2"), 2)
    assert end.code is ExitCode.FAILED and not end.untraced and end.error.startswith("InjectedFault")
    replaced = judge([ev("crash", 2, 34, node="n2", error="ValueError: x", traceback="")],
                     [TaskReport("n2", (0,), "Exited with exit code 1")], ("n1", "n2"), 2)
    assert not replaced.untraced
    # without its trace it is untraced, named by srun's task id (the driver records it as rank 2)
    assert [(u.node, u.rank) for u in judge([], [TaskReport("n2", (0,), "Killed")], ("n1", "n2"), 2).lost] == \
        [("n2", 0)]
    assert task_rank("n2", 0, ("n1", "n2"), 2) == 2 and task_rank("n3", 1, ("n1", "n2"), 2) == 1


@pytest.mark.parametrize(
    "events, code, signal",
    [
        ([ev("finish", 0, 200, tokens_seen=1)], ExitCode.DONE, None),
        ([ev("signal", 0, 80, signal="SIGUSR1", received=""), ev("stop", 0, 80, reason="SIGUSR1", checkpoint=None)],
         ExitCode.RESUME, "SIGUSR1"),
        ([ev("paused", 0, 50, saved=True)], ExitCode.RESUME, None),
        ([ev("gave_up", 0, 9, reason="loss_nan again")], ExitCode.GAVE_UP, None),
    ],
)
def test_orderly_ends(events, code, signal):
    end = judge(events, [])
    assert (end.code, end.signal) == (code, signal)


def test_a_failed_health_check_is_the_nodes_not_the_jobs():
    unhealthy = ev("node_unhealthy", 1, None, node="n2", bad_node="n2", action="drain", xid=79, reason="Xid 79",
                   notes=[])
    # stopped after an emergency save, every rank in order
    end = judge([unhealthy, ev("stop", 0, 40, reason="node n2: Xid 79", checkpoint="x")], [])
    assert end.code is ExitCode.RESUME and end.signal is None and end.unhealthy == ("n2",)
    # refused before training: the refusing task exits 75, srun reports it
    end = judge([unhealthy], [TaskReport("n2", (1,), "Exited with exit code 75")])
    assert end.code is ExitCode.RESUME and end.unhealthy == ("n2",) and not end.lost


def test_a_task_that_ends_before_its_first_trace_is_a_failure_the_driver_records():
    end = judge([], [TaskReport("n1", (0,), "Exited with exit code 2")])
    assert end.code is ExitCode.FAILED and not end.lost and [u.rank for u in end.untraced] == [0]
    assert end.error == "TaskFailed: task 0 on n1 ended before it wrote a trace (Exited with exit code 2)"
    assert judge([], []).error == "TaskFailed: the step ended before any task wrote a trace"


def test_the_allocation_a_job_starts_with():
    a = initial(["n1", "n2", "n3"], 2, 1)
    assert (a.in_use, a.spares, a.target, a.min_nodes) == (("n1", "n2"), ("n3",), 2, 1)
    with pytest.raises(ValueError, match="fewer than the 2"):
        initial(["n1"], 2, 2)


def test_a_driven_job_allocates_its_spares_runs_the_driver_without_srun_and_survives_a_lost_node():
    c = ClusterConfig(kind="slurm", nodes=2, spare_nodes=1, tasks_per_node=4, srun_extra=["--mpi=none"])
    p = executor_parameters(c, "run-a", "")
    assert p["nodes"] == 3 and p["use_srun"] is False and "srun_args" not in p
    assert p["additional_parameters"]["no-kill"] is True
    plain = executor_parameters(ClusterConfig(kind="slurm", nodes=2, spare_nodes=0), "r", "")
    assert plain["nodes"] == 2 and "use_srun" not in plain and "no-kill" not in plain["additional_parameters"]
    shrinking = executor_parameters(ClusterConfig(kind="slurm", nodes=2, elastic=ElasticConfig(min_nodes=1)), "r", "")
    assert shrinking["nodes"] == 2 and shrinking["use_srun"] is False


def test_rendered_sbatch_of_a_driven_job_runs_python_in_the_batch_script(tmp_path):
    from submitit.slurm.slurm import _make_sbatch_string

    c = ClusterConfig(kind="slurm", nodes=2, spare_nodes=1)
    text = _make_sbatch_string(command="python -u -m x", folder=tmp_path, **executor_parameters(c, "run-a", ""))
    lines = text.splitlines()
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --no-kill" in lines
    assert "python -u -m x" in lines and not any(line.startswith("srun") for line in lines)


def test_a_grow_back_is_priced_at_the_newest_restart_this_allocation_measured():
    from resilient_slurm.supervise.driver import restart_cost_s

    def restart(latency_s, restart=0):
        return parse({"event": "restart_in_allocation", "rank": -1, "step": 9, "job_id": "7", "restart": restart,
                      "job_step": 1, "cause": "c", "placement": "p", "replaced": [], "added": [],
                      "latency_s": latency_s})

    assert restart_cost_s([], "7", 0) is None
    assert restart_cost_s([restart(20.5), restart(12.0), restart(None)], "7", 0) == 12.0
    assert restart_cost_s([restart(12.0, restart=1)], "7", 0) is None  # another allocation's

