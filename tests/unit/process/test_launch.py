"""What a supervisor tells a rank: one record, spelled as environment variables in one place."""

import pytest

from resilient_slurm.process.launch import RankLaunch, mark_generation

FULL = RankLaunch(run_dir="/runs/a", rank=3, world_size=8, local_rank=1, local_world_size=2, master_addr="n1",
                  master_port=29501, heartbeat="10.0.0.1:5000", generation=2, driven=True, rejoin=True, join=3,
                  standby=False)


@pytest.mark.parametrize("launch", [FULL, RankLaunch(local_world_size=1),
                                    RankLaunch(run_dir="/r", world_size=2, local_world_size=2, standby=True),
                                    RankLaunch(world_size=2, local_world_size=2, replica_group=1, replica_heal=True,
                                               lighthouse="10.0.0.1:29510")])
def test_it_reads_back_what_it_wrote(launch):
    assert RankLaunch.from_env(launch.to_env()) == launch


def test_torchrun_and_our_own_variables():
    env = FULL.to_env()
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT")} == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                                    "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29501"}
    assert set(env) == set(RankLaunch.names()) and all(k.startswith("RESILIENT_SLURM_") for k in RankLaunch.names()[6:])
    # unknown ranks per node: the world size, as torchrun says it
    assert RankLaunch(world_size=4).to_env()["LOCAL_WORLD_SIZE"] == "4"


def test_an_unsupervised_process_gets_the_defaults_and_foreign_variables_are_ignored():
    assert RankLaunch.from_env({"PATH": "/bin", "RANK": "2", "RESILIENT_SLURM_JOIN": ""}) == RankLaunch(rank=2)


def test_a_rank_that_joins_a_generation_marks_it_in_its_own_environment():
    env = dict(FULL.to_env())
    mark_generation(env, 5)
    assert RankLaunch.from_env(env).generation == 5 and RankLaunch.from_env(env).rank == 3
