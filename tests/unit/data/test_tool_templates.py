"""A Qwen-format chat template, `<|im_start|>` turns and its tool-call branches, rendered as the
directory gives it: text and ids equal transformers' `apply_chat_template(..., tools=...)` (the
oracle), and a `.jsonl` file of tool-use conversations trains on the assistant turns, calls included."""

import json
import re

import pytest

from resilient_slurm.config import DataConfig
from resilient_slurm.data.chat.dataset import open_chat_data
from resilient_slurm.data.chat.format import BadLine, conversation_key, parse_conversation, parse_line
from resilient_slurm.data.tokenizer import ChatTokenizer
from tests.unit.data.conftest import TOOL_CONVERSATIONS


@pytest.mark.parametrize("index", range(len(TOOL_CONVERSATIONS)))
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_tool_calls_render_as_transformers_renders_them(qwen_style_dir, hf_tokenizer, index, generation_prompt):
    conversation = parse_line(json.dumps(TOOL_CONVERSATIONS[index]))
    shown = conversation.messages[:-1] if generation_prompt else conversation.messages
    ours, theirs = ChatTokenizer(str(qwen_style_dir)), hf_tokenizer(qwen_style_dir)
    kwargs = {"tools": conversation.tools} if conversation.tools else {}
    text = theirs.apply_chat_template(shown, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)
    ids = theirs.apply_chat_template(shown, tokenize=True, return_dict=False, add_generation_prompt=generation_prompt,
                                     **kwargs)
    assert text.startswith("<|im_start|>system\n")
    if conversation.tools:
        assert "<tools>\n{\"type\": \"function\"" in text and "Zürich" in json.dumps(TOOL_CONVERSATIONS[0],
                                                                                   ensure_ascii=False)
    if index == 0:
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "C"}}\n</tool_call>' in text
        assert text.count("<tool_response>") == 2 and text.count("<|im_start|>user") == 2
    assert ours.render(shown, generation_prompt, conversation.tools) == text
    assert ours.apply_chat_template(shown, generation_prompt, conversation.tools) == list(ids)


def test_tool_use_lines_train_on_every_assistant_turn_calls_included(qwen_style_dir, tmp_path):
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in TOOL_CONVERSATIONS * 4))
    data = open_chat_data(DataConfig(path=str(path), val_samples=0, seq_len=2048), str(qwen_style_dir), str(tmp_path / "cache"))
    tok = data.tokenizer
    trained = [tok.decode([int(t) for t, keep in zip(data.train.tokens[r], data.train.loss[r]) if keep])
               for r in range(data.train.num_rows)]
    text = "".join(trained)
    assert '<tool_call>\n{"name": "local_time", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>' in text
    assert "21 °C, and it is 14:05.<|im_end|>" in text
    assert "<tool_response>" not in text and "Weather and time in Zürich?" not in text  # prompts are not trained


def test_tool_calls_change_the_conversation_key_and_plain_keys_stay(qwen_style_dir):
    plain = parse_conversation(json.dumps(TOOL_CONVERSATIONS[2]))
    assert conversation_key(plain) == conversation_key([{"role": "user", "content": "What is two plus two?"},
                                                        {"role": "assistant", "content": "Four."}])
    one = parse_line(json.dumps(TOOL_CONVERSATIONS[0]))
    other = json.loads(json.dumps(TOOL_CONVERSATIONS[0]))
    other["messages"][1]["tool_calls"][0]["function"]["arguments"]["city"] = "Bern"
    two = parse_line(json.dumps(other))
    assert conversation_key(one.messages, one.tools) != conversation_key(two.messages, two.tools)
    assert conversation_key(one.messages, one.tools) != conversation_key(one.messages)


@pytest.mark.parametrize("line,why", [
    ({"tools": "get_weather", "messages": TOOL_CONVERSATIONS[2]["messages"]}, "'tools' must be a list"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}, {"role": "assistant", "content": "x"}]},
     "messages[0].tool_calls must be a list of calls (objects) on an assistant message"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]},
     "messages[1].content must be a string"),
])
def test_malformed_tool_use_is_named(line, why):
    with pytest.raises(BadLine, match=re.escape(why)):
        parse_line(json.dumps(line))
