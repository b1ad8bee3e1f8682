"""The tiny pretraining corpus is learnable: a ~3M-parameter model (conf/model/llama_tiny) trained
on it for 120 steps with a plain loop (not the run's trainer, which the token pipeline is not wired
into yet) lowers the held-out loss of both sources far below where it starts. The data path is the
recipe's: generated text → tokenize → prepare → TokenBatchSampler → Batch."""

import math
import time

import pytest
import torch

from resilient_slurm.data.tokens.prepare import compose
from resilient_slurm.data.tokens.token_data import open_token_data
from resilient_slurm.model.decoder import IGNORE_INDEX, plain_model, token_loss_sum

STEPS = 120


def val_loss(model, rows):
    with torch.inference_mode():
        batch = rows.batch(list(range(rows.num_rows)))
        logits = model(batch.input_ids, batch.position_ids, batch.document_ids)
        return float(token_loss_sum(logits, batch.labels)) / int((batch.labels != IGNORE_INDEX).sum())


@pytest.mark.slow
def test_the_tiny_corpus_is_learned_in_a_minute_on_a_cpu(tmp_path):
    cfg = compose(["data=tiny_pretrain", f"data.cache_dir={tmp_path}", "data.val_sequences=32",
                   f"train.max_steps={STEPS}", "data.micro_batch_size=8"])
    torch.manual_seed(0)
    torch.set_num_threads(1)  # on 2 shared cores, more threads than free cores stall each other
    data = open_token_data(cfg)
    sampler = data.sampler(0, 1)
    model = plain_model(cfg.model, cfg.train.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    before = {name: val_loss(model, rows) for name, rows in data.val.items()}
    start = time.perf_counter()
    for step in range(STEPS):
        (b,) = sampler.next_batch()
        for g in opt.param_groups:
            g["lr"] = 2e-3 * min(1.0, (step + 1) / 15)
        loss = token_loss_sum(model(b.input_ids, b.position_ids, b.document_ids), b.labels)
        (loss / int((b.labels != IGNORE_INDEX).sum())).backward()
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - start
    after = {name: val_loss(model, rows) for name, rows in data.val.items()}
    print(f"{STEPS} steps in {seconds:.0f} s; val loss before {before}, after {after}; "
          f"perplexity after { {k: round(math.exp(v), 2) for k, v in after.items()} }")
    assert all(before[k] > math.log(400) for k in before)  # a random model: about ln(vocabulary)
    assert all(after[k] < before[k] / 2 for k in before)
