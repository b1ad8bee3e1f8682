"""`resilient_slurm.api`, the public names a user's own loop imports: each imports from there and
says what it is."""

import importlib

import pytest

api = importlib.import_module("resilient_slurm.api")


@pytest.mark.parametrize("name", api.__all__)
def test_each_public_name_imports_and_has_its_docstring(name):
    value = getattr(api, name)
    assert (value.__doc__ or "").strip(), f"resilient_slurm.api.{name} has no docstring"


def test_the_sketch_of_the_readme_names_exist():
    from resilient_slurm.api import ExitCode, InputError, Session, TrainState  # noqa: F401

    assert callable(Session.from_env) and ExitCode.RESUME == 75
