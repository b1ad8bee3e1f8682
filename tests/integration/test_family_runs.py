"""Qwen2, Qwen3 and Mistral fine-tuned end to end as a user does it (`+experiment=sft
model.pretrained=DIR`), on 2 FSDP2 ranks, from tiny models the real `transformers` wrote (config.json
in transformers 4's spelling for some, 5's for others): the first step trains on the pretrained
weights each rank read by byte range (its loss is the unsharded model's), and hf/ loads with
AutoModelForCausalLM as the family's own class with the run's logits. For Qwen3, whose q/k norms
are tensors the others lack, a run stopped by SIGUSR1 and resumed ends bit-identical to its
uninterrupted twin (resume saves and loads every tensor the same way, whatever the family: one
family with the extra tensors stands for the three, in the suite's time). The Qwen2 run trains on a 240-conversation file
with the default data.val_samples; a Qwen2 LoRA run (adapters beside q/k/v biases) exports an
adapter peft loads with the run's logits."""

import json
import signal

import pytest
import torch

from resilient_slurm.data.batches import PackedBatchSampler
from resilient_slurm.data.chat.dataset import cache_root, open_chat_data
from resilient_slurm.exit_codes import ExitCode
from resilient_slurm.ledger import Kind
from resilient_slurm.model.decoder import token_loss_sum
from resilient_slurm.config.families import FAMILIES
from resilient_slurm.rundir.identity import load_config
from tests.hf_families import load_theirs, make_family_model
from tests.integration.runs import assert_bit_identical, events, final_tensors, finish, interrupt, launch
from tests.integration.test_sft import _full, unsharded

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

STEPS = 16
CASES = [("qwen2", "v4"), ("qwen3", "v5"), ("mistral", "v4")]
IDS = torch.randint(0, 485, (2, 40), generator=torch.Generator().manual_seed(1))


def chat_file(path, n=240):
    """n distinct short conversations: a small user data set."""
    lines = [{"messages": [{"role": "user", "content": f"copy: {' '.join('abcdefgh'[(i + j) % 8] for j in range(i % 5 + 1))} {i}"},
                           {"role": "assistant", "content": f"{' '.join('abcdefgh'[(i + j) % 8] for j in range(i % 5 + 1))} {i}"}]}
             for i in range(n)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def sft(root, name, base, data, *extra):
    return launch(root, name, f"model.pretrained={base}", f"data.path={data}", "cluster.ranks=2", "data.seq_len=64",
                  "data.global_batch_size=4", "data.micro_batch_size=2", "optim.lr=1e-3", "optim.warmup_steps=2",
                  "eval.every_steps=0", "train.log_every_steps=50", f"train.max_steps={STEPS}",
                  "checkpoint.every_steps=5", "tracking.mode=disabled", *extra, base=["+experiment=sft"])


def lora_model(rdir):
    """The LoRA run's final model unsharded: the base as the run held it (bf16), biases included, and
    its adapters from the final checkpoint."""
    from resilient_slurm.model.decoder import LlamaForCausalLM
    from resilient_slurm.model.lora import apply_lora, is_adapter
    from resilient_slurm.model.pretrained import HFWeights

    cfg = load_config(rdir)
    model = LlamaForCausalLM(cfg.model)
    apply_lora(model, cfg.model.lora)
    final = rdir / "checkpoints" / f"step_{STEPS:08d}"
    weights = HFWeights(cfg.model.pretrained)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter(name):
                p.copy_(_full(final, name))
            else:
                held = torch.empty(p.shape, dtype=torch.bfloat16)
                weights.read_rows(name, 0, p.shape[0], held)
                p.copy_(held)
    return model.eval()


@pytest.mark.parametrize("family,spelling", CASES)
def test_a_family_fine_tunes_on_two_ranks_and_exports_its_own_class(tmp_path, family, spelling):
    base = make_family_model(tmp_path / f"base-{family}", family, spelling)
    data = chat_file(tmp_path / "chat.jsonl") if family == "qwen2" else "asset:tiny_chat/chat.jsonl"
    code, out = finish(sft(tmp_path, "straight", base, data), timeout=400)
    assert code == ExitCode.DONE, out
    straight = tmp_path / "sft" / "straight"
    cfg = load_config(straight)
    assert cfg.model.family == family

    # Step 1 trained on the pretrained weights the ranks read by byte range.
    from resilient_slurm.model.pretrained import HFWeights

    weights = HFWeights(str(base))
    first = unsharded(cfg, lambda name, p: weights.read_rows(name, 0, p.shape[0], p.data))
    chat = open_chat_data(cfg.data, str(base), cache_root(cfg))
    batch = PackedBatchSampler(chat.train, cfg.data, cfg.train.seed, 0, 1).next_batch()
    with torch.no_grad():
        loss_sum = sum(float(token_loss_sum(first(b.input_ids, b.position_ids, b.document_ids), b.labels))
                       for b in batch)
    tokens = sum(int((b.labels != -100).sum()) for b in batch)
    logged = json.loads((straight / "metrics.jsonl").read_text().splitlines()[0])
    assert logged["loss"] == pytest.approx(loss_sum / tokens, rel=1e-5)
    if family == "qwen2":  # the defaults on a small file: 5% held out, the rest trains
        ready = next(e for e in events(straight) if e.kind is Kind.DATA_READY).details.counts
        assert (ready["conversations"], ready["val_conversations"]) == (240, 12)

    if family == "qwen3":
        resumed = tmp_path / "sft" / "resumed"
        code, out = interrupt(sft(tmp_path, "resumed", base, data), resumed, 7, signal.SIGUSR1)
        assert code == ExitCode.RESUME, out
        code, out = finish(sft(tmp_path, "resumed", base, data), timeout=400)
        assert code == ExitCode.DONE, out
        assert_bit_identical(final_tensors(straight, STEPS), final_tensors(resumed, STEPS))

    theirs = load_theirs(straight / "hf")
    assert type(theirs).__name__ == FAMILIES[family].architecture
    final = straight / "checkpoints" / f"step_{STEPS:08d}"
    model = unsharded(cfg, lambda name, p: p.copy_(_full(final, name).bfloat16()))
    with torch.no_grad():
        assert torch.equal(model(IDS), theirs(IDS).logits)


def test_a_qwen2_lora_run_exports_an_adapter_peft_loads_with_the_runs_logits(tmp_path):
    peft = pytest.importorskip("peft")
    base = make_family_model(tmp_path / "base-qwen2", "qwen2", "v5")
    code, out = finish(sft(tmp_path, "lora", base, "asset:tiny_chat/chat.jsonl", "model.lora.rank=4",
                           "model.lora.targets=[q_proj,k_proj,v_proj,down_proj]"), timeout=400)
    assert code == ExitCode.DONE, out
    rdir = tmp_path / "sft" / "lora"
    ours = lora_model(rdir)
    held = load_theirs(base, torch.bfloat16).float().eval()
    theirs = peft.PeftModel.from_pretrained(held, rdir / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, ours(IDS), rtol=0, atol=1e-5)
