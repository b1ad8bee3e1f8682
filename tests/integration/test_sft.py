"""Fine-tuning a pretrained Hugging Face Llama end to end, the way a user does it:
`+experiment=sft model.pretrained=DIR data.path=FILE cluster.ranks=2`. The pretrained weights reach
the 2 FSDP2 ranks intact (the first step's loss is the one the unsharded model computes on the same
batch), the run finishes, and its `hf/` loads in transformers with the run's own logits and the
base model's tokenizer and chat template. transformers is the oracle, as a test-only dependency."""

import json

import pytest
import torch

from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.rundir.identity import load_config
from resilient_slurm.data.batches import PackedBatchSampler
from resilient_slurm.data.chat.dataset import cache_root, open_chat_data
from resilient_slurm.model.decoder import LlamaForCausalLM, token_loss_sum
from resilient_slurm.model.pretrained import HFWeights
from tests.hf_model import make_hf_model
from tests.integration.runs import finish, launch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def unsharded(cfg, fill):
    model = LlamaForCausalLM(cfg.model).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            fill(name, p)
    return model


def test_a_pretrained_model_fine_tuned_on_two_ranks_exports_a_model_transformers_loads(tmp_path):
    base = make_hf_model(tmp_path / "base-llama")
    proc = launch(tmp_path, "sft", f"model.pretrained={base}", "data.path=asset:tiny_chat/chat.jsonl", "cluster.ranks=2",
                  "train.max_steps=12", "checkpoint.every_steps=6", "eval.every_steps=12", "eval.task_samples=8",
                  "optim.lr=1e-3", "data.seq_len=64", "data.global_batch_size=4", "data.micro_batch_size=2",
                  base=["+experiment=sft"])
    code, out = finish(proc, timeout=300)
    assert code == ExitCode.DONE, out
    rdir = tmp_path / "sft" / "sft"
    cfg = load_config(rdir)
    assert cfg.model.name == "base-llama" and cfg.model.hidden_size == 64 and cfg.model.pretrained == str(base)

    # Step 1 ran on the pretrained weights: the unsharded model filled from the files, on the same
    # global batch (the exact-position sampler gives it for any world size), computes the same loss.
    weights = HFWeights(str(base))
    first = unsharded(cfg, lambda name, p: weights.read_rows(name, 0, p.shape[0], p.data))
    data = open_chat_data(cfg.data, str(base), cache_root(cfg))
    batch = PackedBatchSampler(data.train, cfg.data, cfg.train.seed, 0, 1).next_batch()
    with torch.no_grad():
        loss_sum = sum(float(token_loss_sum(first(b.input_ids, b.position_ids, b.document_ids), b.labels))
                       for b in batch)
    tokens = sum(int((b.labels != -100).sum()) for b in batch)
    logged = json.loads((rdir / "metrics.jsonl").read_text().splitlines()[0])
    assert logged["step"] == 1 and logged["loss"] == pytest.approx(loss_sum / tokens, rel=1e-5)

    # hf/ is the final checkpoint in bf16, in the base's layout, with the base's tokenizer.
    hf = rdir / "hf"
    assert len(list((rdir / "checkpoints" / "step_00000012").glob("model-*.safetensors"))) == 2  # one per rank
    ours = unsharded(cfg, lambda name, p: p.copy_(_full(rdir / "checkpoints" / "step_00000012", name).bfloat16()))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    ids = torch.randint(0, 485, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(ids), theirs(ids).logits)
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["max_position_embeddings"] == 4096
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    chat = [{"role": "user", "content": "copy: a b c"}]
    assert list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)) == data.tokenizer.apply_chat_template(
        chat, add_generation_prompt=True)


def _full(ckpt, name):
    """A model tensor whole, from the ranks' pieces (as the export reads it)."""
    from resilient_slurm.checkpoint.chunks import whole
    from resilient_slurm.checkpoint.reader import Reader, read_json, saved_tensors
    from resilient_slurm.checkpoint.verify import verify

    manifest = verify(ckpt).manifest
    docs = {rel: read_json(ckpt, rel, manifest) for rel in manifest.files if rel.endswith(".json")}
    saved = saved_tensors(ckpt, "model", manifest, docs)[name]
    out = torch.empty(saved.shape, dtype=saved.dtype)
    reader = Reader(ckpt, manifest, 2)
    reader.add(name, saved, out, whole(saved.shape))
    reader.run()
    return out
