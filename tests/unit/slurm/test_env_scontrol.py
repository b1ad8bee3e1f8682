import pytest

from resilient_slurm.config import ClusterConfig
from resilient_slurm.launch.submit import executor_parameters
from resilient_slurm.slurm.env import SlurmEnv, expand_hostlist, master_port, tasks_per_node


@pytest.mark.parametrize(
    "hostlist, nodes",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1-2,5],login", ["n1", "n2", "n5", "login"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a,b", ["a", "b"]),
        ("rack[1-2]-x", ["rack1-x", "rack2-x"]),
    ],
)
def test_expand_hostlist(hostlist, nodes):
    assert expand_hostlist(hostlist) == nodes


@pytest.mark.parametrize("spec, counts", [("1", [1]), ("2(x3)", [2, 2, 2]), ("2(x2),1", [2, 2, 1]), ("", [1])])
def test_tasks_per_node(spec, counts):
    assert tasks_per_node(spec) == counts


def test_slurm_env_from_a_task_environment():
    env = SlurmEnv.from_env({
        "SLURM_JOB_ID": "42", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_RESTART_COUNT": "2", "SLURM_CPUS_PER_TASK": "8", "SLURM_STEP_ID": "3",
    })
    assert (env.job_id, env.procid, env.ntasks, env.localid, env.local_ntasks) == ("42", 3, 4, 1, 2)
    assert env.nodes == ("n1", "n2") and env.restart_count == 2 and env.cpus_per_task == 8
    assert env.context() == {"job_id": "42", "restart": 2, "job_step": 3, "node": "n2"}
    assert env.attempt == ("42", 2, 3)
    assert SlurmEnv.from_env({"SLURM_JOB_ID": "42"}) is None  # the batch shell, not a task
    assert SlurmEnv.from_env({}) is None


def test_master_port_is_per_job_step_and_in_range():
    assert master_port("42", 0) == master_port("42", 0) != master_port("43", 0)
    # a second start inside the same allocation (a new job step) must not meet the first one's store
    assert master_port("42", 1) != master_port("42", 0)
    assert all(29500 <= master_port(str(j), s) < 39500 for j in (1, 9999, 10000, 123456) for s in (0, 1, 7))


@pytest.mark.parametrize("value, step", [("0", 0), ("5", 5), ("batch", 0), ("extern", 0)])
def test_the_job_step_of_a_task(value, step):
    env = SlurmEnv.from_env({"SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_STEP_ID": value})
    assert env is not None and env.step_id == step


def test_executor_parameters():
    c = ClusterConfig(kind="slurm", partition="gpu", nodes=4, tasks_per_node=8, gpus_per_node=8, cpus_per_task=12,
                      mem_gb=500, time_min=240, account="llm", signal="USR1", signal_lead_s=300,
                      sbatch_extra={"reservation": "big"}, setup=["module load cuda"])
    p = executor_parameters(c, "run-a", "n3,n7")
    assert p["nodes"] == 4 and p["ntasks_per_node"] == 8 and p["gpus_per_node"] == 8 and p["time"] == 240
    assert p["additional_parameters"] == {"signal": "USR1@300", "requeue": True, "reservation": "big"}
    assert p["exclude"] == "n3,n7" and p["mem"] == "512000M" and p["partition"] == "gpu"
    assert p["setup"] == ["module load cuda"] and p["account"] == "llm"
    minimal = executor_parameters(ClusterConfig(kind="slurm"), "r", "")
    assert "exclude" not in minimal and "partition" not in minimal and "gpus_per_node" not in minimal


def test_rendered_sbatch_carries_our_signal_requeue_and_append(tmp_path):
    """submitit renders the script; what matters to resilience must survive its defaults."""
    from submitit.slurm.slurm import _make_sbatch_string

    c = ClusterConfig(kind="slurm", nodes=2, signal="USR1", signal_lead_s=90, time_min=30)
    text = _make_sbatch_string(command="python -u -m x", folder=tmp_path, **executor_parameters(c, "run-a", "n3"))
    lines = text.splitlines()
    assert "#SBATCH --signal=USR1@90" in lines and not any("USR2" in line for line in lines)
    assert "#SBATCH --requeue" in lines and "#SBATCH --open-mode=append" in lines
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --exclude=n3" in lines and "#SBATCH --time=30" in lines


def test_scontrol_finishes_even_when_the_job_is_being_sent_sigterm(tmp_path):
    """After `scontrol requeue` Slurm sends SIGTERM to every process of the job; the scontrol run
    right after it (ExcNodeList) must not die of it. A stand-in scontrol signals itself."""
    import signal

    from resilient_slurm.slurm.scontrol import scontrol

    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nkill -TERM $$\necho \"updated $*\"\n")
    fake.chmod(0o755)
    ok, out = scontrol("update", "jobid=7", "ExcNodeList=n1", binary=str(fake))
    assert ok and out.strip() == "updated update jobid=7 ExcNodeList=n1"
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the caller's mask is restored


# `scontrol show node --oneliner n1,n2` of Slurm 22.05 (the sandbox's), n2 drained by the health
# check while the job held it: values with spaces (OS=, Reason=) must not shift the fields.
SHOW_NODES = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=2.26 NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=17001 Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=4000 AllocMem=0 FreeMem=14070 Sockets=2 Boards=1 State=ALLOCATED ThreadsPerCore=1 TmpDisk=0 "
    "Partitions=debug,high  CfgTRES=cpu=2,mem=4000M,billing=2 AllocTRES=cpu=1\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=2.26 NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=17002 Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=4000 AllocMem=0 FreeMem=14070 Sockets=2 Boards=1 State=ALLOCATED+DRAIN ThreadsPerCore=1 "
    "Partitions=debug,high  CfgTRES=cpu=2,mem=4000M,billing=2 AllocTRES=cpu=1 "
    "Reason=resilient_slurm: node n2: Xid 79 State=IDLE [root@2026-12-01T13:20:01]\n"
)


def test_node_states_from_scontrol_show_node():
    from resilient_slurm.slurm.scontrol import parse_node_states

    assert parse_node_states(SHOW_NODES) == {"n1": "ALLOCATED", "n2": "ALLOCATED+DRAIN"}
    assert parse_node_states("") == {}


@pytest.mark.parametrize(
    "state, takes_work",
    [
        ("IDLE", True), ("ALLOCATED", True), ("MIXED", True), ("IDLE+COMPLETING", True), ("ALLOCATED+RESERVED", True),
        # out until a person or its own health check returns it to service
        ("ALLOCATED+DRAIN", False), ("IDLE+DRAIN", False), ("DOWN", False), ("DOWN*+DRAIN", False),
        ("IDLE+FAIL", False), ("MIXED+FAILING", False),
        ("IDLE*", False),  # not responding
    ],
)
def test_a_node_in_service_takes_work(state, takes_work):
    from resilient_slurm.slurm.scontrol import in_service

    assert in_service(state) is takes_work
