"""The silent-data-corruption sentinel on real runs of gloo ranks: one bit flipped in one rank's
parameter shard after an update (`fault.sdc_step`; the flip is the one thing faked, since a real
one needs faulty memory) is found at that step, its rank named by the majority of three replicas,
by a third rank's re-run of the update between two replicas, by both replicas' re-runs in place
across two replica groups (cluster.replica_ft, whose copies meet only through torchft's sum; the
majority across three groups is the same rule on the same gathered fingerprints), or by a buddy's
re-run without replicas; it is healed over the network, the node goes on the exclude list, and the run goes on to
end bit-identical to its twin that no bit flip touched. Nothing is read back from disk."""

from pathlib import Path

import pytest

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import Kind
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, launch, run_dir

pytestmark = pytest.mark.slow

STEPS = 12
SHORT = [f"train.max_steps={STEPS}", "checkpoint.every_steps=0", "optim.warmup_steps=2", "train.threads=1",
         "cluster.collective_timeout_s=60"]


def flipped_and_twin(tmp_path: Path, layout: list[str], step: int, rank: int) -> tuple[Path, list]:
    """The run with the flip and its twin without, side by side; the flipped run's directory and ledger."""
    exclude = tmp_path / "exclude.json"
    flipped = launch(tmp_path, "flip", *SHORT, *layout, f"fault.sdc_step={step}", f"fault.sdc_rank={rank}",
                     f"cluster.exclude_file={exclude}")
    twin = launch(tmp_path, "twin", *SHORT, *layout)
    for proc in (flipped, twin):
        code, out = finish(proc)
        assert code == ExitCode.DONE, out
    rdir = run_dir(tmp_path, "flip")
    assert_bit_identical(final_tensors(run_dir(tmp_path, "twin"), STEPS), final_tensors(rdir, STEPS))
    return rdir, events(rdir)


def the_finding(ev: list, step: int, rank: int, exclude: Path):
    (sdc,) = [e for e in ev if e.kind is Kind.SDC]
    d = sdc.details
    assert sdc.step == step and d.ranks == [rank] and d.action == "healed" and d.verified, d
    assert d.tensors and d.heal_s is not None and d.heal_s >= 0
    (unhealthy,) = [e for e in ev if e.kind is Kind.NODE_UNHEALTHY]
    assert unhealthy.details.bad_node == d.nodes[0] and unhealthy.details.reason.startswith("sdc: ")
    listed = exclude_list.load(str(exclude))
    assert list(listed) == d.nodes and listed[d.nodes[0]].reason.startswith("sdc: ")
    # nothing rolled back or restarted: one start, and no load after it
    assert len([e for e in ev if e.kind is Kind.START]) == 1
    assert not [e for e in ev if e.kind in (Kind.RESUME, Kind.ROLLBACK, Kind.CRASH)]
    return d


def test_three_replicas_outvote_the_flipped_one(tmp_path):
    rdir, ev = flipped_and_twin(tmp_path, ["cluster.ranks=3", "parallel.dp_replicate=3",
                                           "data.global_batch_size=6", "data.micro_batch_size=2"], step=4, rank=1)
    d = the_finding(ev, 4, 1, tmp_path / "exclude.json")
    assert d.check == "replicas" and d.decided_by == "majority" and d.source == "group 0"
    flipped = [x for x in d.evidence if x["rank"] == 1]
    assert flipped and all(x["fingerprint"] != y["fingerprint"] for x in flipped
                           for y in d.evidence if y["rank"] == 0 and y["tensor"] == x["tensor"])


def test_two_replicas_are_settled_by_a_third_ranks_rerun_of_the_update(tmp_path):
    # HSDP 2 x 2: ranks 1 and 3 hold the same shard; rank 0 (of neither copy) re-runs its update
    rdir, ev = flipped_and_twin(tmp_path, ["cluster.ranks=4", "parallel.dp_replicate=2",
                                           "data.micro_batch_size=1"], step=5, rank=3)
    d = the_finding(ev, 5, 3, tmp_path / "exclude.json")
    assert d.check == "replicas" and d.decided_by == "rerun" and d.source == "group 0"
    third = {x["rank"] for x in d.evidence if x.get("rerun_of") == 1}
    assert third & {0, 2}, d.evidence  # a rank outside the two copies gave the third opinion


def test_without_replicas_a_buddys_rerun_of_the_update_finds_and_heals_it(tmp_path):
    rdir, ev = flipped_and_twin(tmp_path, ["cluster.ranks=2", "monitor.sdc.rerun_every_steps=4"], step=8, rank=1)
    d = the_finding(ev, 8, 1, tmp_path / "exclude.json")
    assert d.check == "rerun" and d.decided_by == "rerun" and d.source == "rank 0"


def test_across_replica_groups_the_flipped_group_is_found_by_both_rerunning_the_update_and_healed(tmp_path):
    # cluster.replica_ft: two groups of one rank, each a process group of its own that meets the
    # other only through torchft's sum; the twin is the same run without the flip
    rdir, ev = flipped_and_twin(tmp_path, ["cluster.ranks=2", "parallel.dp_replicate=2", "cluster.replica_ft=true",
                                           "tracking.mode=disabled"], step=5, rank=1)
    d = the_finding(ev, 5, 1, tmp_path / "exclude.json")
    assert d.check == "replicas" and d.decided_by == "rerun" and d.source == "group 0"
    assert {x["rank"] for x in d.evidence if x.get("rerun_of") is not None} == {0, 1}, d.evidence
    assert not [e for e in ev if e.kind in (Kind.REPLICA_LEAVE, Kind.REPLICA_HEAL)], "no group left: healed in place"

