"""Shared test setup: keep every test hermetic (no wandb traffic, no writes outside tmp dirs), and
keep the Slurm tests together when the suite runs on several workers (pytest-xdist)."""

import compileall
import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")


def pytest_sessionstart(session):
    # The package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (as on this
    # project's machines) every process the tests start (launchers, ranks, Slurm tasks) would
    # otherwise compile each module of the package it imports, half a second to a second of CPU
    # each time. Reading bytecode is not affected by that variable, only writing it.
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "resilient_slurm", quiet=1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # The Slurm tests share the one sandbox cluster, so they run one after another on one worker
    # (`--dist loadgroup`: the largest group is handed out first). They mostly wait on the
    # scheduler and on paced steps, so the CPU-bound tests run beside them on the other worker.
    # A module- or session-scoped fixture of ours is built once per worker that runs a test using
    # it: the tests sharing one (or sharing one with a test that shares another) run on one worker,
    # so that each is built once; they are runs and models taking seconds to minutes to build.
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm-sandbox"))
    for group in _sharing(i for i in items if not i.get_closest_marker("slurm")):
        for item in group:
            item.add_marker(pytest.mark.xdist_group(f"shared:{group[0].nodeid.split('::')[0]}"))


def _sharing(items) -> list[list]:
    """The tests that share module- or session-scoped fixtures defined under tests/, in connected
    groups (tests using none are left out)."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent[key] != key:
            key = parent[key]
        return key

    users: list[tuple] = []
    for item in items:
        keys = [f"{d.baseid}::{name}" for name in item.fixturenames
                for d in item._fixtureinfo.name2fixturedefs.get(name, ())
                if d.scope in ("module", "session") and d.baseid.startswith("tests")]
        for key in keys:
            parent.setdefault(key, key)
            parent[root(key)] = root(keys[0])
        if keys:
            users.append((item, keys[0]))
    groups: dict[str, list] = {}
    for item, key in users:
        groups.setdefault(root(key), []).append(item)
    return list(groups.values())
