"""Threads per rank: never more than the CPUs this process may use, shared among the node's ranks;
OpenMP yields instead of spinning unless the user chose otherwise."""

import pytest

from resilient_slurm.process.threads import choose_threads, yield_when_idle


@pytest.mark.parametrize("configured, cpus, per_task, ranks, expected", [
    (0, 2, None, 1, 2),      # a laptop, one rank
    (0, 2, None, 2, 1),      # two ranks share two cores
    (0, 2, None, 4, 1),      # more ranks than cores: one thread each, never zero
    (0, 64, 8, 8, 8),        # a Slurm task with 8 CPUs of its own
    (0, 4, 8, 1, 4),         # ... but never more than its affinity mask allows
    (3, 64, 8, 8, 3),        # train.threads wins
])
def test_choose_threads(configured, cpus, per_task, ranks, expected):
    assert choose_threads(configured, cpus, per_task, ranks) == expected


@pytest.mark.parametrize("env, expected", [
    ({}, "PASSIVE"),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
    ({"OMP_PROC_BIND": "close"}, None),
    ({"OMP_PROC_BIND": "false"}, "PASSIVE"),
])
def test_openmp_yields_unless_told_otherwise(env, expected):
    env = dict(env)
    yield_when_idle(env)
    assert env.get("OMP_WAIT_POLICY") == expected
