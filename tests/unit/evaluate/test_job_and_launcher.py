"""One evaluation of a real checkpoint (a tiny pretrained model after one step, saved by the
project's checkpoint code): exported, scored by the real lm-eval, recorded at the checkpoint's step;
a failed attempt is recorded and retried once (the failure is injected: a harness that raises on its
first call), a second one is final; the retention pin goes either way. The launcher's batch script,
and a launch that cannot start is recorded without raising."""

import json
import sys

import pytest

from resilient_slurm.checkpoint import store
from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.config import Config, ModelConfig
from resilient_slurm.evaluate import job, launcher
from resilient_slurm.ledger import EventLog, Kind, read_events
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.model.pretrained import apply_pretrained
from resilient_slurm.rundir.benchmarks import read_scores
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.slurm.sbatch import sbatch
from tests.hf_model import make_hf_model
from tests.single_rank import one_rank

pytest.importorskip("lm_eval")
STEP = 7


@pytest.fixture
def run(tmp_path):
    """A run directory with a committed checkpoint of step 7: (run_dir, config)."""
    cfg = Config()
    cfg.model = apply_pretrained(ModelConfig(pretrained=str(make_hf_model(tmp_path / "base"))))
    cfg.data.tokenizer = cfg.model.pretrained
    cfg.eval.harness.tasks, cfg.eval.harness.limit, cfg.eval.harness.dtype = ["tiny_mmlu"], 2, "float32"
    model = LlamaForCausalLM(cfg.model)
    optimizer = build_optimizer(model, cfg.optim)
    snap = capture_snapshot(model, optimizer, build_scheduler(optimizer, cfg.optim, 10), TrainState(step=STEP))
    run_dir = tmp_path / "run"
    save(run_dir / "checkpoints", STEP, snap, one_rank(), 1 << 30, 1)
    return run_dir, cfg


def test_a_checkpoint_is_exported_scored_and_recorded_at_its_step(run):
    run_dir, cfg = run
    pin = store.pin(run_dir / "checkpoints", STEP, job.PIN_HOLDER)
    outcome = job.evaluate_checkpoint(run_dir, cfg, STEP, where="local")
    assert outcome.errors == [] and set(outcome.scores) == {"tiny_mmlu/acc"}
    rows = read_scores(run_dir / "benchmarks.jsonl")
    assert len(rows) == 1 and rows[0]["step"] == STEP and rows[0]["scores"] == outcome.scores
    assert rows[0]["attempt"] == 1 and rows[0]["where"] == "local"
    done = [e for e in read_events(run_dir / "events.jsonl") if e.kind is Kind.EVAL_DONE]
    assert len(done) == 1 and done[0].step == STEP and done[0].details.export_seconds > 0
    work = job.work_dir(run_dir, STEP)
    assert (work / "results.json").is_file() and not (work / "hf").exists()  # the export is removed after
    assert not pin.exists()


def test_a_failed_attempt_is_recorded_and_retried_once(run, monkeypatch):
    run_dir, cfg = run
    real, calls = job.run_harness, []

    def first_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "run_harness", first_fails)
    outcome = job.evaluate_checkpoint(run_dir, cfg, STEP)
    assert outcome.scores is not None and len(calls) == 2
    kinds = [(e.kind, e.details.attempt) for e in read_events(run_dir / "events.jsonl")]
    assert kinds == [(Kind.EVAL_FAILED, 1), (Kind.EVAL_DONE, 2)]
    assert read_scores(run_dir / "benchmarks.jsonl")[0]["attempt"] == 2


def test_two_failures_are_final_and_release_the_pin(run, monkeypatch):
    run_dir, cfg = run
    cfg.eval.harness.wait_commit_s = 0.5
    pin = store.pin(run_dir / "checkpoints", STEP + 1, job.PIN_HOLDER)
    outcome = job.evaluate_checkpoint(run_dir, cfg, STEP + 1)  # no such checkpoint: never committed
    assert outcome.scores is None and len(outcome.errors) == 2 and "is not a committed checkpoint" in outcome.errors[0]
    failed = [e.details for e in read_events(run_dir / "events.jsonl")]
    assert [(f.attempt, f.final) for f in failed] == [(1, False), (2, True)]
    assert not pin.exists() and not (run_dir / "benchmarks.jsonl").exists()


def test_the_by_hand_command_scores_a_checkpoint(run, capsys):
    from resilient_slurm.evaluate.__main__ import main
    from resilient_slurm.rundir.identity import write_config

    run_dir, cfg = run
    write_config(run_dir, cfg)
    assert main([str(run_dir), "--step", str(STEP), "--tasks", "tiny_mmlu"]) == 0
    assert capsys.readouterr().out.startswith(f"step {STEP}: tiny_mmlu/acc ")
    assert read_scores(run_dir / "benchmarks.jsonl")[0]["where"] == "by hand"
    assert main([str(run_dir), "--step", "99"]) == 1


def test_the_batch_script_asks_for_one_gpu_in_the_runs_partition_unless_set(tmp_path):
    cfg = Config()
    cfg.cluster.partition, cfg.cluster.account, cfg.cluster.qos = "train", "proj", "normal"
    cfg.cluster.setup = ["module load cuda", "source /venv/bin/activate"]
    script = launcher.batch_script(cfg, tmp_path / "my run", 200)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {"#SBATCH --gpus=1", "#SBATCH --partition=train", "#SBATCH --account=proj", "#SBATCH --qos=normal",
            "#SBATCH --ntasks=1", "#SBATCH --time=60"} <= set(lines)
    assert f"#SBATCH --output={tmp_path / 'my run' / 'evals' / 'step_00000200' / 'eval.log'}" in lines
    assert lines[-3:-1] == cfg.cluster.setup
    assert lines[-1] == f"exec {sys.executable} -m resilient_slurm.evaluate '{tmp_path / 'my run'}' --step 200 --where slurm"
    cfg.eval.harness.partition, cfg.eval.harness.gpus = "eval", 0
    lines = launcher.batch_script(cfg, tmp_path, 1).splitlines()
    assert "#SBATCH --partition=eval" in lines and not [x for x in lines if "--gpus" in x]


def test_sbatch_passes_the_script_and_reads_the_job_id(tmp_path):
    # A stand-in sbatch that answers in sbatch --parsable's format and keeps what it was given.
    fake = tmp_path / "sbatch"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat > {tmp_path}/script\necho '4242;cluster'\n")
    fake.chmod(0o755)
    assert sbatch("#!/bin/bash\necho hi\n", binary=str(fake)) == (True, "4242")
    assert (tmp_path / "args").read_text().strip() == "--parsable"
    assert (tmp_path / "script").read_text() == "#!/bin/bash\necho hi\n"
    ok, why = sbatch("x", binary=str(tmp_path / "none"))
    assert not ok and "cannot run" in why


def test_a_launch_that_cannot_start_is_recorded_and_training_goes_on(tmp_path, monkeypatch):
    cfg = Config()
    cfg.cluster.kind = "slurm"
    cfg.eval.harness.tasks, cfg.eval.harness.every_steps = ["tiny_mmlu"], 10
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(launcher, "sbatch", lambda script, env: sbatch(script, binary=str(tmp_path / "no-sbatch"), env=env))
    side = launcher.SideEvaluations(cfg, run_dir, EventLog(run_dir / "events.jsonl"), rank=0)
    assert side.where == "slurm" and [s for s in range(1, 31) if side.due(s)] == [10, 20, 30]
    side.launch(10, run_dir / "checkpoints")  # must not raise
    failed = read_events(run_dir / "events.jsonl")
    assert [e.kind for e in failed] == [Kind.EVAL_FAILED] and failed[0].details.final
    assert "launch: RuntimeError: cannot run" in failed[0].details.error
    assert store.pinned_steps(run_dir / "checkpoints") == frozenset()


def test_a_local_launch_starts_a_detached_child_and_records_it(tmp_path, monkeypatch):
    cfg = Config()
    cfg.eval.harness.tasks, cfg.eval.harness.every_steps = ["tiny_mmlu"], 5
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    # The child is a real process; what it runs is a stand-in that records its argv (the evaluation
    # itself is tested above and end to end in tests/integration/test_benchmarks.py).
    monkeypatch.setattr(launcher, "command", lambda r, s, w: [sys.executable, "-c",
                                                              f"import sys,os; open({str(tmp_path / 'argv')!r},'w').write(str(os.getsid(0) == os.getpid()))"])
    side = launcher.SideEvaluations(cfg, run_dir, EventLog(run_dir / "events.jsonl"), rank=0)
    side.launch(5, run_dir / "checkpoints")
    side.children[0].wait(timeout=60)
    assert (tmp_path / "argv").read_text() == "True"  # a session of its own: the run's signals do not reach it
    launched = read_events(run_dir / "events.jsonl")[0]
    assert launched.kind is Kind.EVAL_LAUNCHED and launched.step == 5 and launched.details.where == "local"
    assert store.pinned_steps(run_dir / "checkpoints") == frozenset({5})  # the evaluation releases it
    assert launcher.SideEvaluations(cfg, run_dir, EventLog(run_dir / "events.jsonl"), rank=1).launch(5, run_dir) is None
    assert json.loads(json.dumps(launched.record))["log"].endswith("evals/step_00000005/eval.log")


def test_an_evaluation_does_not_start_as_a_rank_of_the_training(tmp_path, monkeypatch):
    """Seen in the benchmarks test: a child that inherited rank 0's RANK/WORLD_SIZE/MASTER_PORT made
    lm-eval's accelerate bind the training's rendezvous port (EADDRINUSE). The child's environment
    is the training's without what makes a process a rank; the rest (PATH, threads, the user's) stays."""
    training = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n1",
                "MASTER_PORT": "37555", "TORCHELASTIC_RUN_ID": "x", "RESILIENT_SLURM_HEARTBEAT": "n1:5000",
                "RESILIENT_SLURM_DRIVEN": "1", "PATH": "/usr/bin", "HF_HOME": "/data/hf", "SLURM_JOB_ID": "7"}
    assert launcher.eval_env(training) == {"PATH": "/usr/bin", "HF_HOME": "/data/hf", "SLURM_JOB_ID": "7"}
    cfg = Config()
    cfg.eval.harness.tasks, cfg.eval.harness.every_steps = ["tiny_mmlu"], 5
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for key, value in training.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(launcher, "command", lambda r, s, w: [sys.executable, "-c",
                                                              f"import os; open({str(tmp_path / 'env')!r},'w').write("
                                                              f"str(sorted(k for k in os.environ if 'RANK' in k or 'MASTER' in k)))"])
    side = launcher.SideEvaluations(cfg, run_dir, EventLog(run_dir / "events.jsonl"), rank=0)
    side.launch(5, run_dir / "checkpoints")
    side.children[0].wait(timeout=60)
    assert (tmp_path / "env").read_text() == "[]"
