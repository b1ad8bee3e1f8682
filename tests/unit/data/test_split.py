"""How much is held out for validation: the default min(256, 5%) that never leaves less than 90% to
train on, a share, a count, none; and a small file opened with the defaults."""

import json

import pytest

from resilient_slurm.config import DataConfig
from resilient_slurm.data.chat.build import DataFormatError
from resilient_slurm.data.chat.dataset import open_chat_data
from resilient_slurm.data.chat.split import held_out


@pytest.mark.parametrize("distinct,val_samples,expected", [
    (240, None, 12), (400, None, 20), (4000, None, 200), (100_000, None, 256), (15, None, 1), (5, None, 0),
    (9, None, 0), (240, 0, 0), (240, 0.1, 24), (240, 0.001, 1), (240, 30, 30), (240, 30.0, 30), (240, 240, 240),
])
def test_held_out(distinct, val_samples, expected):
    assert held_out(distinct, val_samples) == expected


@pytest.mark.parametrize("distinct", range(1, 2000, 7))
def test_the_default_never_leaves_less_than_90_percent_to_train_on(distinct):
    n = held_out(distinct, None)
    assert 0 <= n <= 256 and distinct - n >= 0.9 * distinct


def _file(tmp_path, n):
    """n distinct conversations."""
    path = tmp_path / "chat.jsonl"
    lines = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
             for i in range(n)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_240_conversation_file_opens_with_the_defaults_and_holds_out_5_percent(tmp_path):
    data = open_chat_data(DataConfig(path=str(_file(tmp_path, 240))), "asset:tiny_chat", str(tmp_path / "cache"))
    s = data.stats
    assert (s.conversations, s.val_conversations) == (240, 12)
    assert s.train_rows == data.train.num_rows > 0 and s.val_rows == data.val.num_rows > 0
    assert s.train_tokens > 0 and s.val_tokens > 0


def test_val_samples_0_holds_out_nothing_without_an_error(tmp_path):
    data = open_chat_data(DataConfig(path=str(_file(tmp_path, 50)), val_samples=0), "asset:tiny_chat",
                          str(tmp_path / "cache"))
    assert (data.stats.val_conversations, data.val.num_rows, data.stats.val_tokens, data.eval_samples()) == (0, 0, 0, [])
    assert data.stats.conversations == 50 and data.train.num_rows > 0


def test_a_count_that_leaves_nothing_to_train_on_is_refused_in_one_line(tmp_path):
    with pytest.raises(DataFormatError) as err:
        open_chat_data(DataConfig(path=str(_file(tmp_path, 20)), val_samples=20), "asset:tiny_chat",
                       str(tmp_path / "cache"))
    assert "\n" not in str(err.value) and str(err.value).startswith("data.val_samples: 20 holds out 20")
