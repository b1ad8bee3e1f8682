"""The project's static gates, run with the tests so CI enforces them: the type checker over the
package, the architecture rules (pure modules import nothing with side effects; no import cycles;
a small package root, every sub-package with its map)."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "resilient_slurm"

# Decisions, parsers, catalogs and layouts: they take data and return data.
PURE = ["monitor/detectors.py", "monitor/replay.py", "recovery.py", "launch/naming.py", "analysis/goodput.py",
        "analysis/rank_ends.py",
        "slurm/env.py", "tracking/history.py", "checkpoint/layout.py", "checkpoint/chunks.py", "checkpoint/plan.py",
        "checkpoint/names.py",
        "checkpoint/manifest.py", "checkpoint/policy.py", "checkpoint/retention.py", "checkpoint/crc32.py",
        "checkpoint/costs.py", "checkpoint/deadline.py", "checkpoint/interval.py", "checkpoint/nodes.py", "checkpoint/memory_policy.py",
        "health/xid_catalog.py", "replica/roles.py", "replica/verdict.py",
        "health/kernel_log.py", "health/verdict.py", "slurm/placement.py", "slurm/srun.py", "slurm/step_end.py",
        "simulate/failures.py",
        "simulate/scenario.py", "simulate/costs.py", "simulate/history.py", "simulate/tiers.py", "simulate/engine.py", "simulate/saving.py", "simulate/partial.py", "simulate/published.py",
        "simulate/results.py", "simulate/report.py", "simulate/bench.py", "simulate/scaling.py",
        "simulate/memory.py", "data/chat/format.py", "data/packing.py",
        "data/chat/tiny.py", "export/hf_layout.py", "model/families.py", "data/chat/split.py", "sweep/space.py", "sweep/feed.py", "sweep/asha.py",
        "sweep/pbt.py", "sweep/replay.py", "sweep/outcome.py", "export/peft_layout.py", "rundir/paths.py",
        "checkpoint/collectives.py", "monitor/heartbeats.py", "monitor/stragglers.py", "supervise/conclusion.py",
        "process/launch.py", "health/node_policy.py", "analysis/faults.py", "data/tokens/idx_format.py", "data/tokens/plan.py",
        "data/tokens/position.py", "data/tokens/records.py", "replica/plan.py", "data/tokens/tiny_corpus.py", "launch/command.py",
        "session/step_sync.py", "session/step_record.py", "session/replica_place.py",
        "parallel/estimate.py", "launch/plan_report.py",
        *(f"config/{m}.py" for m in ("checks", "families", "run", "model", "data", "train", "checkpoint", "cluster", "monitor",
                                     "tracking", "faults", "sweep", "schema", "overrides", "harness", "parallel"))]
SIDE_EFFECTS = {"subprocess", "socket", "signal", "threading", "shutil", "torch", "wandb", "mlflow", "submitit",
                "pynvml", "fcntl", "mmap", "requests", "urllib"}


def test_types():
    pytest.importorskip("mypy")
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PACKAGE.parent / "pyproject.toml"),
                           str(PACKAGE)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_side_effecting_library(module):
    tree = ast.parse((PACKAGE / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & SIDE_EFFECTS, f"{module} imports {sorted(imported & SIDE_EFFECTS)}"


def _imports(path: Path) -> set[str]:
    """Every `resilient_slurm` module a file imports, at module level or inside functions (a lazy
    import still ties the two modules together), resolved to module names."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("resilient_slurm")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("resilient_slurm"):
            # `from pkg import mod` imports a module when `mod` is one, else a name of `pkg`.
            out |= {f"{node.module}.{a.name}" if _module_path(f"{node.module}.{a.name}") else node.module
                    for a in node.names}
    return out


def _module_path(name: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycles():
    graph = {_module_name(p): {m for m in _imports(p) if _module_path(m)} for p in PACKAGE.rglob("*.py")}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_package_root_stays_small_and_every_sub_package_has_its_map():
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= 9, root_modules
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        listed = {line.split()[0] for line in doc.splitlines() if line.startswith("    ") and line.split()}
        modules = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
        assert modules <= listed, f"{init.parent.name}/__init__.py's map lacks {sorted(modules - listed)}"


# The package's floors, from the ground up: a module imports only from its own floor or those below.
FLOORS = ["exit_codes", "errors", "files", "console", "process", "config", "ledger", "recovery", "slurm", "rundir", "health",
          "monitor", "tracking", "analysis", "checkpoint", "session", "model", "parallel", "replica", "data", "export", "evaluate", "trainer",
          "runtime", "api", "supervise", "launch", "sweep",
          "simulate", "report", "compare"]
# Re-exports at old paths that queued Slurm jobs' pickles name: they point up on purpose.
LEGACY_REEXPORTS = {"slurm/task.py", "slurm/driver.py"}
MAX_MODULE_LINES = 500


def _floor(module: str) -> str:
    """`resilient_slurm.checkpoint.save` -> `checkpoint`; a root module is its own floor."""
    return module.split(".")[1]


def test_imports_follow_the_floors_and_floors_form_no_cycle():
    parts = {p.stem if p.parent == PACKAGE else p.parent.relative_to(PACKAGE).parts[0]
             for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE}
    assert parts <= set(FLOORS), f"parts with no floor in FLOORS: {sorted(parts - set(FLOORS))}"
    against = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "__init__.py" or str(path.relative_to(PACKAGE)) in LEGACY_REEXPORTS:
            continue
        here = _floor(_module_name(path))
        for target in _imports(path):
            if _module_path(target) and FLOORS.index(_floor(target)) > FLOORS.index(here):
                against.append(f"{path.relative_to(PACKAGE)} -> {target}")
    assert not against, "imports against the floors: " + "; ".join(sorted(against))


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them along a responsibility): {long}"


def test_every_module_imports():
    """Catches a stale import path, which mypy (with --ignore-missing-imports) lets through."""
    for path in PACKAGE.rglob("*.py"):
        if path.stem != "__main__":
            importlib.import_module(_module_name(path))


def test_every_module_imports_without_the_tracking_backends():
    """wandb and mlflow are extras: only their sinks (and readers) import them, inside functions. A
    None in sys.modules makes each unimportable, as if it were not installed."""
    script = ("import importlib, sys\n"
              "sys.modules['wandb'] = sys.modules['mlflow'] = None\n"
              f"for name in {sorted(_module_name(p) for p in PACKAGE.rglob('*.py') if p.stem != '__main__')!r}:\n"
              "    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_bench_script_shadows_the_standard_library():
    """`python bench/X.py` puts bench/ first on sys.path: a bench/tokenize.py broke every other
    bench (dataclasses -> inspect -> linecache imports `tokenize`)."""
    bench = PACKAGE.parent / "bench"
    shadowing = sorted(p.name for p in bench.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not shadowing, f"bench/{', bench/'.join(shadowing)} shadow standard-library modules; rename them"


def test_test_modules_have_unique_names():
    """pytest imports test modules by basename (the test folders are not packages): two of a name
    make one of them fail to collect."""
    names = [p.name for p in (PACKAGE.parent / "tests").rglob("test_*.py")]
    assert not {n for n in names if names.count(n) > 1}
