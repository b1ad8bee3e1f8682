"""Shared test setup: keep every test hermetic (no wandb traffic, no writes outside tmp dirs), and
keep the Slurm tests together when the suite runs on several workers (pytest-xdist)."""

import os

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # The Slurm tests share the one sandbox cluster, so they run one after another on one worker
    # (`--dist loadgroup`: the largest group is handed out first). They mostly wait on the
    # scheduler and on paced steps, so the CPU-bound tests run beside them on the other worker.
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm-sandbox"))
