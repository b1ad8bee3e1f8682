"""A rank really slowed (a CPU quota on its process, cgroups) is found by the local launcher's
heartbeat monitor as a straggler from the ranks' step sections, recorded with its scores, and its
node marked in the cluster's node record. Without a spare there is nothing to swap: the run goes on
and finishes. Real processes and a real quota; nothing is faked."""

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health import node_record
from resilient_slurm.ledger import Kind
from tests.cpucg import cpu_quota
from tests.integration.runs import events, finish, launch, run_dir, wait_for_step
from tests.integration.test_heartbeat_local import rank_pid
from tests.slurm.jobs import wait_until

pytestmark = pytest.mark.slow


def test_a_throttled_rank_is_a_straggler_and_its_node_is_marked(tmp_path):
    record = tmp_path / "nodes.jsonl"
    proc = launch(tmp_path, "slow", "cluster.ranks=2", "train.threads=1", "monitor.straggler.steps=5",
                  f"health.node_record={record}")
    rdir = run_dir(tmp_path, "slow")
    wait_for_step(proc, rdir, 20)
    with cpu_quota(0.2) as quota:
        quota.add(rank_pid(rdir, 1))
        wait_until("a straggler", lambda: [e for e in events(rdir) if e.kind is Kind.STRAGGLER], 120, 0.1)
    code, out = finish(proc)
    assert code == ExitCode.DONE, out

    (found,) = [e for e in events(rdir) if e.kind is Kind.STRAGGLER]
    s = found.details
    assert found.rank == 1 and s.action == "report" and s.steps == 5, found  # no spare: only recorded
    assert s.ratio > 1.5 and s.compute_s > s.others_s and s.scores["1"] < 1 <= s.scores["0"], s
    # its own compute is what is slow: the fast rank waits for it, it hardly waits for the fast one
    assert s.sections["forward"] + s.sections["backward"] + s.sections["optimizer"] > s.sections["collective"], s
    (mark,) = node_record.read(str(record))
    assert (mark.node, mark.kind, mark.detail["rank"]) == (found.node, node_record.STRAGGLER, 1)
