"""Evaluation: exact match by greedy decoding, and no trace left on the model or the RNGs."""

import random

import numpy as np
import pytest
import torch
from torch import nn

from resilient_slurm.config import Config
from resilient_slurm.runtime.evaluation import (
    Evaluator,
    ExactMatch,
    Prediction,
    greedy_decode,
    render_tokens,
)
from resilient_slurm.workload.data import (
    EOS,
    FIRST_ITEM,
    SEP,
    TASK_TOKEN,
    VAL_SPLIT,
    make_sample,
)
from resilient_slurm.workload.model import build_model
from tests.single_rank import one_rank


def small_config(every=10):
    c = Config()
    c.model.hidden_size, c.model.intermediate_size, c.model.num_layers, c.model.vocab_size = 64, 160, 2, 128
    c.data.seq_len, c.data.max_items, c.data.micro_batch_size, c.data.global_batch_size = 48, 8, 2, 4
    c.data.val_samples = 24
    c.eval.every_steps, c.eval.task_samples, c.eval.predictions = every, 10, 3
    c.train.max_steps = 25
    return c


class Oracle(nn.Module):
    """Predicts each sample's target: the next token is looked up from the prompt it continues."""

    def __init__(self, cfg, wrong_tasks=()):
        super().__init__()
        self.vocab = cfg.model.vocab_size
        self.answers = {}
        for i in range(cfg.data.val_samples):
            s = make_sample(cfg.data, cfg.train.seed, VAL_SPLIT, i)
            response = [EOS] * len(s.response) if s.task in wrong_tasks else s.response
            for k in range(len(response)):
                self.answers[tuple(s.prompt + response[:k])] = response[k]

    def forward(self, seq):
        logits = torch.zeros(seq.shape[0], seq.shape[1], self.vocab)
        for row, tokens in enumerate(seq.tolist()):
            logits[row, -1, self.answers.get(tuple(tokens), 0)] = 1.0
        return logits


def one_rank():
    return one_rank()


def test_exact_match_counts_whole_responses():
    cfg = small_config()
    assert Evaluator(cfg, Oracle(cfg), one_rank()).run().task == {"exact_match": 1.0}
    wrong = Evaluator(cfg, Oracle(cfg, wrong_tasks=("sort",)), one_rank()).run()
    samples = [make_sample(cfg.data, cfg.train.seed, VAL_SPLIT, i) for i in range(10)]
    assert wrong.task["exact_match"] == pytest.approx(sum(s.task != "sort" for s in samples) / 10)
    shown = wrong.predictions["exact_match"]
    assert len(shown) == 3
    assert all(p.correct == (p.task != "sort") and (p.prediction == p.target) == p.correct for p in shown)


class AlwaysRight:
    """A task metric plugged in through the hook."""

    name = "always"

    def judge(self, model, samples, device, batch):
        return [Prediction(s.task, "p", "t", "t", True) for s in samples]


def test_task_metrics_are_a_hook():
    cfg = small_config()
    result = Evaluator(cfg, build_model(cfg.model, 1), one_rank(), metrics=[AlwaysRight(), ExactMatch()]).run()
    assert set(result.task) == {"always", "exact_match"} and result.task["always"] == 1.0
    assert [len(p) for p in result.predictions.values()] == [3, 3]


def test_evaluating_leaves_weights_and_every_rng_untouched():
    cfg = small_config()
    model = build_model(cfg.model, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    result = Evaluator(cfg, model, one_rank()).run()
    assert result.val_loss > 0 and set(result.task) == {"exact_match"} and result.seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng[0], torch.get_rng_state()) and (rng[1] == np.random.get_state()[1]).all()
    assert rng[2] == random.getstate()
    again = Evaluator(cfg, model, one_rank()).run()
    assert again.val_loss == result.val_loss and again.predictions == result.predictions


@pytest.mark.parametrize("every, max_steps, due", [(10, 25, [10, 20, 25]), (0, 25, []), (5, 10, [5, 10])])
def test_due_every_n_steps_and_at_the_end(every, max_steps, due):
    cfg = small_config(every)
    cfg.train.max_steps = max_steps
    ev = Evaluator(cfg, build_model(cfg.model, 1), one_rank())
    assert [s for s in range(1, max_steps + 1) if ev.due(s)] == due


def test_no_task_metric_when_switched_off():
    cfg = small_config()
    cfg.eval.task_samples = 0
    result = Evaluator(cfg, build_model(cfg.model, 1), one_rank()).run()
    assert result.task == {} and result.predictions == {} and result.val_loss > 0


def test_greedy_decode_is_as_long_as_the_target():
    cfg = small_config()
    samples = [s for s in (make_sample(cfg.data, 0, VAL_SPLIT, i) for i in range(40)) if len(s.prompt) == 7][:2]
    out = greedy_decode(build_model(cfg.model, 1), samples, torch.device("cpu"))
    assert len(out) == len(samples) and all(len(o) == len(samples[0].response) for o in out)


def test_render_tokens():
    prompt = [1, TASK_TOKEN["reverse"], FIRST_ITEM + 3, FIRST_ITEM + 17, SEP]
    assert render_tokens(prompt) == "reverse 3 17 |"
    assert render_tokens([FIRST_ITEM, EOS, 9]) == "0 </s> <9>"
