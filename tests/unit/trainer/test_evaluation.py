"""Evaluation on the held-out conversations: greedy generation through the chat template, exact
match against the reference, validation loss; and it changes nothing in training. The tiny chat set
the package ships is the data; the models are real (a random one, and an oracle that knows every
answer, standing in for a trained model)."""

import pytest
import torch
from torch import nn

from resilient_slurm.config import Config, DataConfig
from resilient_slurm.trainer.evaluation import Evaluator, greedy_decode
from resilient_slurm.data.chat.dataset import open_chat_data
from resilient_slurm.model.decoder import plain_model
from tests.single_rank import one_rank


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return open_chat_data(DataConfig(val_samples=40), "asset:tiny_chat", str(tmp_path_factory.mktemp("cache")))


def config(task_samples=12, batch=4):
    cfg = Config()
    cfg.eval.every_steps, cfg.eval.task_samples, cfg.eval.predictions = 10, task_samples, 3
    cfg.data.micro_batch_size = batch
    return cfg


class Oracle(nn.Module):
    """Knows the reference answer of every held-out prompt (a perfectly trained model)."""

    def __init__(self, samples, vocab, wrong=()):
        super().__init__()
        self.answers = {tuple(s.prompt_ids): s.target_ids for s in samples}
        self.wrong = {tuple(s.prompt_ids) for s in wrong}
        self.vocab = vocab

    def forward(self, ids, pos, docs):
        logits = torch.zeros(ids.shape[0], ids.shape[1], self.vocab)
        for row in range(ids.shape[0]):
            real = ids[row][docs[row] >= 0].tolist()
            for n in range(1, len(real) + 1):
                answer = self.answers.get(tuple(real[:n]))
                if answer is not None:
                    done = len(real) - n
                    nxt = answer[done] if done < len(answer) else 0
                    if tuple(real[:n]) in self.wrong:
                        nxt = (nxt + 1) % self.vocab
                    logits[row, -1, nxt] = 1.0
        return logits


def test_exact_match_counts_the_answers_generated_exactly(data):
    cfg = config()
    samples = data.eval_samples(12)
    right = Evaluator(cfg, Oracle(samples, 512), one_rank(), data).run()
    assert right.task == {"exact_match": 1.0} and right.val_loss > 0
    shown = right.predictions["exact_match"]
    assert len(shown) == 3 and all(p.correct and p.prediction == p.target for p in shown)
    wrong = Evaluator(cfg, Oracle(samples, 512, wrong=samples[:3]), one_rank(), data).run()
    assert wrong.task["exact_match"] == pytest.approx(9 / 12)


def test_batched_greedy_decoding_is_what_each_prompt_gives_alone(data):
    model = plain_model(Config().model, seed=3).eval()
    prompts = [s.prompt_ids for s in data.eval_samples(5)]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    with torch.inference_mode():
        together = greedy_decode(model, prompts, 6, torch.device("cpu"))
        alone = [greedy_decode(model, [p], 6, torch.device("cpu"))[0] for p in prompts]
    assert together == alone


def test_evaluating_changes_neither_the_model_nor_the_random_streams(data):
    model = plain_model(Config().model, seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    Evaluator(config(task_samples=4), model, one_rank(), data).run()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())


@pytest.mark.parametrize("step, due", [(10, True), (15, False), (300, True), (0, True)])
def test_due_every_n_steps_and_at_the_last(data, step, due):
    ev = Evaluator(config(task_samples=0), plain_model(Config().model, 0), one_rank(), data)
    assert ev.due(step) is due


def test_evaluation_shows_its_progress_in_batches_while_it_runs(data, capsys):
    """40 held-out conversations pack into the validation rows, then 12 samples decode 4 at a time:
    the bar counts both, and (off a terminal, as here) ends with a line of its own at 100%."""
    cfg = config()
    evaluator = Evaluator(cfg, Oracle(data.eval_samples(12), 512), one_rank(), data)
    val_batches = sum(-(-len(rows) // 4) for rows in evaluator.val_rows.values())
    evaluator.run(step=10)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"evaluating at step 10: 0/{val_batches + 3} batch (0%)")
    assert lines[-1].startswith(f"evaluating at step 10: {val_batches + 3}/{val_batches + 3} batch (100%)")
