"""LoRA runs end to end, as a user launches them: `+experiment=sft model.pretrained=DIR model.lora.rank=R`
on 2 FSDP2 ranks. Interrupted by SIGUSR1 and SIGKILL (and its hot tier lost, so it resumes from the
cold one), a run ends bit-identical to its uninterrupted twin; its checkpoints hold the adapters
alone; its hf/ loads in peft with the run's own logits, and `--merge` writes a model transformers
loads with them too; a resume against another base model is refused, naming it. transformers and
peft are the oracles (test-only dependencies)."""

import json
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file

from resilient_slurm.checkpoint.chunks import whole
from resilient_slurm.checkpoint.reader import Reader, read_json, saved_tensors
from resilient_slurm.checkpoint.verify import verify
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.export.__main__ import main as export_main
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.ledger import Kind
from resilient_slurm.model.lora import apply_lora, is_adapter
from resilient_slurm.model.decoder import LlamaForCausalLM
from resilient_slurm.model.pretrained import HFWeights, identity
from tests.hf_model import make_hf_model
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, interrupt, launch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

STEPS = 30


def lora_run(tmp_path, name, base, *extra):
    return launch(tmp_path, name, f"model.pretrained={base}", "data.path=asset:tiny_chat/chat.jsonl",
                  "data.seq_len=64", "data.global_batch_size=4", "data.micro_batch_size=2", "optim.lr=1e-3",
                  "optim.warmup_steps=2", "eval.every_steps=0", "train.log_every_steps=50",
                  "model.lora.rank=4", "model.lora.dropout=0.1", "model.lora.targets=[q_proj,v_proj,down_proj]",
                  *extra, base=["+experiment=sft"])


def run_dir(root, name):
    return root / "sft" / name


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A LoRA run on 2 ranks that was never interrupted: (root, its run directory, the base model)."""
    root = tmp_path_factory.mktemp("lora")
    base = make_hf_model(root / "base-llama")
    code, out = finish(lora_run(root, "straight", base, "cluster.ranks=2", f"train.max_steps={STEPS}",
                                "checkpoint.every_steps=10"), timeout=300)
    assert code == ExitCode.DONE, out
    return root, run_dir(root, "straight"), base


def test_interrupted_and_moved_to_the_cold_tier_it_ends_bit_identical_holding_adapters_only(finished):
    root, straight, base = finished
    extra = ["cluster.ranks=2", f"train.max_steps={STEPS}", "checkpoint.every_steps=10",
             f"checkpoint.cold.url={root / 'cold'}"]
    rdir = run_dir(root, "resumed")
    code, out = interrupt(lora_run(root, "resumed", base, *extra), rdir, 8, signal.SIGUSR1)
    assert code == ExitCode.RESUME, out
    code, out = interrupt(lora_run(root, "resumed", base, *extra), rdir, 17, signal.SIGKILL)
    assert code == -signal.SIGKILL
    shutil.rmtree(rdir / "checkpoints")  # a new node's empty disk: only the cold tier has them
    code, out = finish(lora_run(root, "resumed", base, *extra), timeout=300)
    assert code == ExitCode.DONE, out

    assert_bit_identical(final_tensors(straight, STEPS), final_tensors(rdir, STEPS))
    resumes = [e for e in events(rdir) if e.kind is Kind.RESUME]
    assert len(resumes) == 2 and resumes[-1].details.source == "cold"
    final = rdir / "checkpoints" / f"step_{STEPS:08d}"
    assert verify(final).ok
    names = [n.split("/", 1)[1] for n in final_tensors(rdir, STEPS) if n.startswith("model")]
    assert names and all(is_adapter(n) for n in names)
    train_state = json.loads((final / "train_state.json").read_text())
    assert train_state["base_model"] == {"path": str(base), "identity": identity(str(base))}
    assert train_state["lora"]["rank"] == 4


def ours(rdir):
    """The run's final model unsharded: the base as the run held it (bf16 weights), its adapters
    from the final checkpoint (read whole from the ranks' pieces)."""
    cfg = load_config(rdir)
    model = LlamaForCausalLM(cfg.model)
    apply_lora(model, cfg.model.lora)
    ckpt = rdir / "checkpoints" / f"step_{STEPS:08d}"
    manifest = verify(ckpt).manifest
    docs = {rel: read_json(ckpt, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    saved = saved_tensors(ckpt, "model", manifest, docs)
    weights = HFWeights(cfg.model.pretrained)
    reader = Reader(ckpt, manifest, 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter(name):
                reader.add(name, saved[name], p.data, whole(saved[name].shape))
            else:
                held = torch.empty(p.shape, dtype=torch.bfloat16)
                weights.read_rows(name, 0, p.shape[0], held)
                p.copy_(held)
        reader.run()
    return model.eval()


def base_as_held(base):
    return transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).float().eval()


IDS = torch.randint(0, 485, (2, 40), generator=torch.Generator().manual_seed(1))


def test_the_peft_adapter_in_hf_loads_in_peft_with_the_runs_logits(finished):
    _, rdir, base = finished
    hf = rdir / "hf"
    config = json.loads((hf / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == ("LORA", "CAUSAL_LM", 4, 16.0)
    assert config["target_modules"] == ["q_proj", "v_proj", "down_proj"] and config["base_model_name_or_path"] == str(base)
    assert all(k.startswith("base_model.model.model.layers.") for k in load_file(hf / "adapter_model.safetensors"))
    theirs = peft.PeftModel.from_pretrained(base_as_held(base), hf).eval()
    with torch.no_grad():
        logits, plain = ours(rdir)(IDS), base_as_held(base)(IDS).logits
        assert (logits - plain).abs().max() > 1e-2  # the adapters learned something to compare
        assert torch.equal(theirs(IDS).logits, logits)  # same operations in the same order: same bits


def test_merged_export_loads_in_transformers_with_the_runs_logits(finished, tmp_path, capsys):
    _, rdir, _ = finished
    out = tmp_path / "merged"
    assert export_main([str(rdir), str(out), "--merge", "--dtype", "float32"]) == 0
    assert "adapters merged" in capsys.readouterr().out
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        # (W + s·B·A)x rounds differently from Wx + s·B(Ax): equal up to float32 rounding.
        torch.testing.assert_close(theirs(IDS).logits, ours(rdir)(IDS), rtol=0, atol=1e-5)


def test_a_resume_on_another_base_model_is_refused_naming_it(tmp_path):
    base = make_hf_model(tmp_path / "base-llama")
    steps = ["train.max_steps=4", "checkpoint.every_steps=2"]
    # Paused at step 2, not finished: a finished run is not run again at all.
    code, out = finish(lora_run(tmp_path, "r", base, *steps, "train.pause_at_step=2"))
    assert code == ExitCode.RESUME, out
    make_hf_model(base, seed=1)  # the same directory now holds other weights
    code, out = finish(lora_run(tmp_path, "r", base, *steps))
    assert code == ExitCode.CONFIG, out
    line = next(line for line in out.splitlines() if "trained on the base model" in line)
    assert str(base) in line and identity(str(base))[:16] in line and "model.pretrained" in line
    assert (run_dir(tmp_path, "r") / "checkpoints" / "step_00000002").is_dir()  # refused, not skipped
