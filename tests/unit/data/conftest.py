"""The reference for the token pipeline's format tests: Megatron-LM's own reader and writer."""

import importlib.util
import logging
import sys
import types

import pytest


@pytest.fixture(scope="session")
def megatron():
    """megatron.core.datasets.indexed_dataset, the format's reference implementation (megatron-core,
    a test-only dependency). megatron/core/__init__.py imports most of Megatron (model parallel,
    optimizers: ~30 s); the dataset module needs only numpy, torch and two small helpers, so the
    package roots are stand-ins that only make the real submodules importable, and
    `megatron.core.utils` (which pulls in the parallel state) is replaced by its one logging helper
    the dataset module calls. Nothing of the format's code is replaced."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed (pip install megatron-core)")
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("megatron", root), ("megatron.core", f"{root}/core"),
                       ("megatron.core.datasets", f"{root}/core/datasets")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    if "megatron.core.utils" not in sys.modules:
        utils = types.ModuleType("megatron.core.utils")
        utils.log_single_rank = lambda logger, level, msg, *a, **k: logger.log(level, msg)
        sys.modules["megatron.core.utils"] = utils
    from megatron.core.datasets import indexed_dataset

    logging.getLogger(indexed_dataset.__name__).setLevel(logging.WARNING)
    return indexed_dataset
