"""The bench scripts are files, not a package: load one as a module to test its parts."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"


def load_bench(name: str):
    """bench/<name>.py as the module `bench_<name>` (registered, as dataclasses need)."""
    module_name = f"bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def spawnable(name: str, tmp_path: Path, monkeypatch) -> None:
    """Ranks spawned by bench/<name>.py unpickle its workers as `bench_<name>.<fn>`: a module of that
    name on the path they inherit runs the bench file (run as a script, the bench is `__main__`,
    which spawn finds without this)."""
    path = str(BENCH / f"{name}.py")
    (tmp_path / f"bench_{name}.py").write_text(f"exec(compile(open({path!r}).read(), {path!r}, 'exec'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
