"""Exporting a LoRA run's checkpoint: the adapter alone (PEFT files), and what a merge refuses: a base
other than the one the adapters were trained on, and a run that has no adapters. peft and
transformers load real exports in tests/integration/test_lora.py."""

import dataclasses
import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from resilient_slurm.checkpoint.save import save
from resilient_slurm.checkpoint.train_state import TrainState
from resilient_slurm.checkpoint.state import capture_snapshot
from resilient_slurm.config import Config
from resilient_slurm.export.__main__ import main as export_main
from resilient_slurm.export.from_checkpoint import export_checkpoint
from resilient_slurm.export.hf_writer import ExportError
from resilient_slurm.trainer.optim import build_optimizer, build_scheduler
from resilient_slurm.model.lora import apply_lora
from resilient_slurm.model.decoder import plain_model
from resilient_slurm.model.pretrained import apply_pretrained, identity
from tests.hf_model import make_hf_model
from tests.single_rank import one_rank


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory):
    """A one-rank LoRA checkpoint over a small pretrained model: (config, checkpoint path)."""
    root = tmp_path_factory.mktemp("lora")
    cfg = Config()
    cfg.model.pretrained = str(make_hf_model(root / "base"))
    cfg.model = apply_pretrained(cfg.model)
    cfg.model.lora.rank = 2
    model = plain_model(cfg.model, seed=0)
    apply_lora(model, cfg.model.lora)
    optimizer = build_optimizer(model, cfg.optim)
    model(torch.randint(0, 512, (1, 8))).float().mean().backward()
    optimizer.step()
    base = {"path": cfg.model.pretrained, "identity": identity(cfg.model.pretrained)}
    snap = capture_snapshot(model, optimizer, build_scheduler(optimizer, cfg.optim, 10),
                            TrainState(step=1, lora={"rank": 2}, base_model=base))
    return cfg, save(root / "checkpoints", 1, snap, one_rank(), 1 << 30, 1).path


def test_the_adapter_export_holds_the_adapters_in_float32_under_peft_names(lora_checkpoint, tmp_path):
    cfg, ckpt = lora_checkpoint
    written = export_checkpoint(ckpt, tmp_path / "adapter", cfg)
    assert (written.format, written.dtype) == ("peft", "float32")
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert len(tensors) == 2 * 4 * 2 and {t.dtype for t in tensors.values()} == {torch.float32}
    assert "base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight" in tensors
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 2


def test_a_merge_onto_a_base_that_changed_since_training_is_refused_naming_it(lora_checkpoint, tmp_path):
    cfg, ckpt = lora_checkpoint
    other = make_hf_model(tmp_path / "base", seed=1)
    moved = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=str(other)))
    with pytest.raises(ExportError) as err:
        export_checkpoint(ckpt, tmp_path / "merged", moved, merge=True)
    message = str(err.value)
    assert "\n" not in message and cfg.model.pretrained in message and str(other) in message
    assert identity(str(other))[:16] in message and not (tmp_path / "merged").exists()


def test_merge_asked_of_a_full_fine_tune_is_a_usage_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(Config())))
    assert export_main([str(run), str(tmp_path / "out"), "--merge"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "full fine-tune" in err and "without --merge" in err
