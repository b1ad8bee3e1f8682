import json

import pytest

from resilient_slurm.data.chat.format import BadLine, conversation_key, parse_conversation

USER, ASSISTANT = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}


@pytest.mark.parametrize("record, messages", [
    ({"messages": [USER, ASSISTANT]}, [USER, ASSISTANT]),
    ({"messages": [{"role": "system", "content": "s", "name": "x"}, USER, ASSISTANT]},
     [{"role": "system", "content": "s"}, USER, ASSISTANT]),
    ({"prompt": "hi", "completion": "hello"}, [USER, ASSISTANT]),
    ({"prompt": [{"role": "system", "content": "s"}, USER], "completion": [ASSISTANT]},
     [{"role": "system", "content": "s"}, USER, ASSISTANT]),
])
def test_both_formats_parse_to_messages(record, messages):
    assert parse_conversation(json.dumps(record)) == messages


@pytest.mark.parametrize("line, reason", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "a JSON list"),
    ('{"text": "hi"}', "no 'messages'"),
    ('{"prompt": "hi"}', "no 'completion'"),
    ('{"messages": []}', "non-empty list"),
    ('{"messages": ["hi"]}', "messages[0] is a str"),
    ('{"messages": [{"role": "human", "content": "hi"}]}', "messages[0].role is 'human'"),
    ('{"messages": [{"role": "user", "content": 3}]}', "messages[0].content must be a string"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
])
def test_malformed_lines_say_what_is_wrong(line, reason):
    with pytest.raises(BadLine) as err:
        parse_conversation(line)
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_the_split_key_depends_on_content_only():
    a = parse_conversation(json.dumps({"prompt": "hi", "completion": "hello"}))
    b = parse_conversation('{"messages":[{"content":"hi","role":"user"},{"role":"assistant","content":"hello"}]}')
    assert conversation_key(a) == conversation_key(b)
    assert conversation_key(a) != conversation_key([USER, {"role": "assistant", "content": "hello!"}])
