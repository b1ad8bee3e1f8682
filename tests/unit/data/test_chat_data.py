import json
import multiprocessing
import os
import random

import numpy as np
import pytest

from resilient_slurm.config import DataConfig
from resilient_slurm.data.chat import dataset as chat_data
from resilient_slurm.data.chat.build import DataFormatError
from resilient_slurm.data.fingerprint import DataChangedError
from resilient_slurm.data.chat.dataset import open_chat_data
from resilient_slurm.data.chat.format import parse_conversation
from resilient_slurm.data.chat.tiny import conversations
from resilient_slurm.data.tokenizer import ChatTokenizer

TINY = "asset:tiny_chat"


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def cfg(path, **kw):
    return DataConfig(path=str(path), val_samples=kw.pop("val_samples", 20), **kw)


@pytest.fixture
def data_file(tmp_path):
    return write_jsonl(tmp_path / "chat.jsonl", conversations(300, seed=1))


def row_documents(rows, tok):
    """Every document of every row, as token lists."""
    out = []
    for r in range(rows.num_rows):
        docs, tokens = np.asarray(rows.docs[r]), np.asarray(rows.tokens[r])
        out += [tokens[docs == d].tolist() for d in np.unique(docs[docs >= 0])]
    return out


def test_rows_hold_the_conversations_as_the_template_tokenizes_them(data_file, tmp_path):
    data = open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"))
    tok = data.tokenizer
    expected = sorted(tok.apply_chat_template(parse_conversation(line)) for line in data_file.read_text().splitlines())
    got = sorted(row_documents(data.train, tok) + row_documents(data.val, tok))
    assert got == expected
    s = data.stats
    assert (s.lines, s.conversations, s.val_conversations, s.skipped_lines) == (300, 300, 20, 0)
    assert s.train_rows == data.train.num_rows and not s.cache_hit


def test_a_cache_hit_maps_the_entry_without_tokenizing(data_file, tmp_path, monkeypatch):
    first = open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"))
    mtimes = {f: os.stat(os.path.join(first.entry, f)).st_mtime_ns for f in os.listdir(first.entry)}

    def no_build(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(chat_data, "build", no_build)
    again = open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"), recorded=first.fingerprint.to_record())
    assert again.stats.cache_hit and again.entry == first.entry
    assert {f: os.stat(os.path.join(first.entry, f)).st_mtime_ns for f in os.listdir(first.entry)} == mtimes
    assert np.array_equal(again.train.tokens, first.train.tokens)
    monkeypatch.undo()
    other = open_chat_data(cfg(data_file, seq_len=64), TINY, str(tmp_path / "cache"))
    assert not other.stats.cache_hit and other.entry != first.entry  # a setting that changes the rows


def test_a_resume_against_a_changed_data_file_is_refused_naming_it(data_file, tmp_path, monkeypatch):
    first = open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"))
    with data_file.open("a") as f:
        f.write(json.dumps({"prompt": "new", "completion": "line"}) + "\n")
    monkeypatch.setattr(chat_data, "build", lambda *a: pytest.fail("tokenized before the check"))
    with pytest.raises(DataChangedError) as err:
        open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"), recorded=first.fingerprint.to_record())
    message = str(err.value)
    assert str(data_file) in message and "changed" in message and "\n" not in message


def test_a_directory_of_files_names_the_one_that_appeared(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", conversations(150, seed=1))
    first = open_chat_data(cfg(folder), TINY, str(tmp_path / "cache"))
    assert first.stats.files == 1
    extra = write_jsonl(folder / "b.jsonl", conversations(10, seed=2))
    with pytest.raises(DataChangedError, match=f"{extra} appeared"):
        open_chat_data(cfg(folder), TINY, str(tmp_path / "cache"), recorded=first.fingerprint.to_record())


def bad_file(tmp_path):
    lines = list(conversations(100, seed=3))
    lines[6] = '{"messages": [{"role": "user", "content": "hi"}'  # line 7: cut short
    lines[40] = {"messages": [{"role": "bot", "content": "hi"}]}  # line 41: unknown role
    return write_jsonl(tmp_path / "bad.jsonl", lines)


def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path):
    path = bad_file(tmp_path)
    with pytest.raises(DataFormatError) as err:
        open_chat_data(cfg(path), TINY, str(tmp_path / "cache"))
    message = str(err.value)
    assert message.startswith(f"{path}:7: not valid JSON") and "data.bad_lines=skip" in message
    assert "\n" not in message and not os.listdir(tmp_path / "cache")[1:]  # only the lock file, no entry


def test_bad_lines_skip_counts_them(tmp_path):
    path = bad_file(tmp_path)
    data = open_chat_data(cfg(path, bad_lines="skip"), TINY, str(tmp_path / "cache"))
    s = data.stats
    assert (s.lines, s.skipped_lines, s.conversations) == (100, 2, 98)
    assert s.skipped_examples[0].startswith(f"{path}:7:") and s.skipped_examples[1].startswith(f"{path}:41:")


def test_a_conversation_the_template_refuses_is_a_bad_line(tmp_path, llama3_dir):
    # This template raises on a conversation that starts with the assistant.
    lines = list(conversations(60, seed=4)) + [{"messages": [{"role": "assistant", "content": "hi"}]}]
    path = write_jsonl(tmp_path / "c.jsonl", lines)
    with pytest.raises(DataFormatError, match=f"{path}:61: the chat template refused it: Conversations start"):
        open_chat_data(cfg(path, val_samples=5), str(llama3_dir), str(tmp_path / "cache"))
    data = open_chat_data(cfg(path, val_samples=5, bad_lines="skip"), str(llama3_dir), str(tmp_path / "cache"))
    assert data.stats.skipped_lines == 1 and data.stats.conversations == 60


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_overlong_conversations_are_truncated_or_dropped_and_counted(data_file, tmp_path, overlong):
    seq_len = 40
    tok = ChatTokenizer(chat_data.resolve_path(TINY))
    lengths = [len(tok.apply_chat_template(parse_conversation(line))) for line in data_file.read_text().splitlines()]
    over = sum(n > seq_len for n in lengths)
    assert 0 < over < len(lengths) // 2
    data = open_chat_data(cfg(data_file, seq_len=seq_len, overlong=overlong), TINY, str(tmp_path / "cache"))
    s = data.stats
    if overlong == "drop":
        assert (s.truncated, s.dropped) == (0, over)
    else:
        assert s.truncated + s.dropped == over and s.truncated > 0
    docs = row_documents(data.train, tok) + row_documents(data.val, tok)
    assert len(docs) == len(lengths) - s.dropped and max(map(len, docs)) <= seq_len
    assert sum(len(d) == seq_len for d in docs) >= s.truncated


def test_the_held_out_split_is_fixed_by_content_not_order(data_file, tmp_path):
    lines = data_file.read_text().splitlines()
    random.Random(0).shuffle(lines)
    shuffled = write_jsonl(tmp_path / "shuffled.jsonl", lines)
    a = open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"))
    b = open_chat_data(cfg(shuffled), TINY, str(tmp_path / "cache"))
    held_out = lambda d: sorted(map(tuple, row_documents(d.val, d.tokenizer)))
    assert held_out(a) == held_out(b) and len(held_out(a)) == 20
    assert not set(held_out(a)) & set(map(tuple, row_documents(a.train, a.tokenizer)))


def test_eval_samples_are_the_held_out_prompts_and_last_replies(data_file, tmp_path):
    data = open_chat_data(cfg(data_file), TINY, str(tmp_path / "cache"))
    samples = data.eval_samples()
    assert len(samples) == data.stats.eval_samples == 20 and len(data.eval_samples(3)) == 3
    held_out = set(map(tuple, row_documents(data.val, data.tokenizer)))
    for s in samples:
        assert tuple(s.prompt_ids + s.target_ids) in held_out
        assert s.prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert s.target.endswith("<|eot_id|>") and s.target_ids[-1] in data.tokenizer.eos_ids
        assert data.decode(s.target_ids) == s.target


def _open_in_child(args):
    path, cache = args
    data = open_chat_data(cfg(path), TINY, cache)
    return data.entry, data.stats.cache_hit


def test_ranks_starting_at_once_build_the_entry_once(data_file, tmp_path):
    with multiprocessing.get_context("fork").Pool(3) as pool:
        results = pool.map(_open_in_child, [(str(data_file), str(tmp_path / "cache"))] * 3)
    assert len({entry for entry, _ in results}) == 1
    assert sorted(hit for _, hit in results) == [False, True, True]
    assert [n for n in os.listdir(tmp_path / "cache") if ".tmp-" in n] == []


def test_the_shipped_tiny_chat_set_loads(tmp_path):
    data = open_chat_data(DataConfig(path=f"{TINY}/chat.jsonl"), TINY, str(tmp_path / "cache"))
    s = data.stats
    assert s.conversations == 4000 and s.skipped_lines == 0 and s.dropped == 0
    assert data.tokenizer.vocab_size <= 512  # conf/model/llama_tiny.yaml
    assert s.train_tokens / (s.train_rows * 128) > 0.9  # rows are well filled
    sample = data.eval_samples(1)[0]
    assert sample.prompt.startswith("<|begin_of_text|>") and sample.target.endswith("<|eot_id|>")
