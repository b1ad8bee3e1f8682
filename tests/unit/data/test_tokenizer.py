import json

import pytest

from resilient_slurm.data.chat.dataset import resolve_path
from resilient_slurm.data.chat_template import TemplateRenderError
from resilient_slurm.data.tokenizer import ChatTokenizer, TokenizerError
from tests.unit.data.conftest import CONVERSATIONS, write_tokenizer_dir


@pytest.mark.parametrize("which", ["llama3_dir", "chatml_dir", "tiny"])
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_text_and_ids_equal_transformers(which, generation_prompt, request, hf_tokenizer):
    path = resolve_path("asset:tiny_chat") if which == "tiny" else request.getfixturevalue(which)
    ours, theirs = ChatTokenizer(str(path)), hf_tokenizer(path)
    for messages in CONVERSATIONS:
        shown = messages[:-1] if generation_prompt else messages
        text = theirs.apply_chat_template(shown, tokenize=False, add_generation_prompt=generation_prompt)
        ids = theirs.apply_chat_template(shown, tokenize=True, return_dict=False,
                                         add_generation_prompt=generation_prompt)
        assert ours.render(shown, generation_prompt) == text
        assert ours.apply_chat_template(shown, generation_prompt) == list(ids)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False)


def test_special_tokens_and_eos_ids_come_from_the_model_files(llama3_dir, hf_tokenizer):
    tok = ChatTokenizer(str(llama3_dir))
    theirs = hf_tokenizer(llama3_dir)
    assert tok.special_tokens["bos_token"] == theirs.bos_token == "<|begin_of_text|>"
    eot, end = tok.tokenizer.token_to_id("<|eot_id|>"), tok.tokenizer.token_to_id("<|end_of_text|>")
    assert tok.eos_ids == (eot, end)  # the tokenizer's eos first, then generation_config's others
    assert tok.pad_id == eot and tok.vocab_size == len(theirs)
    # No double BOS: the template writes it, encoding adds nothing (the post-processor would).
    ids = tok.apply_chat_template(CONVERSATIONS[0])
    assert ids.count(tok.tokenizer.token_to_id("<|begin_of_text|>")) == 1


def test_chat_template_jinja_takes_priority_over_the_config(tmp_path):
    path = write_tokenizer_dir(tmp_path, "{{ 'from-config' }}", "<|eot_id|>")
    (path / "chat_template.jinja").write_text("{{ 'from-file' }}")
    assert ChatTokenizer(str(path)).render(CONVERSATIONS[0]) == "from-file"


def test_a_directory_without_a_template_is_refused_naming_it_and_the_fix(tmp_path):
    path = write_tokenizer_dir(tmp_path, "x", "<|eot_id|>")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError) as err:
        ChatTokenizer(str(path))
    message = str(err.value)
    assert str(path) in message and "chat_template" in message and "\n" not in message


def test_a_directory_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        ChatTokenizer(str(tmp_path))


def test_the_template_runs_sandboxed_and_raise_exception_is_a_render_error(tmp_path):
    escape = "{{ messages.__class__.__mro__ }}"
    path = write_tokenizer_dir(tmp_path / "a", escape, "<|eot_id|>")
    with pytest.raises(TemplateRenderError):
        ChatTokenizer(str(path)).render(CONVERSATIONS[0])
    refuse = "{{ raise_exception('roles must alternate') }}"
    path = write_tokenizer_dir(tmp_path / "b", refuse, "<|eot_id|>")
    with pytest.raises(TemplateRenderError, match="roles must alternate"):
        ChatTokenizer(str(path)).render(CONVERSATIONS[0])


def test_tojson_keeps_non_ascii_like_transformers(tmp_path, hf_tokenizer):
    path = write_tokenizer_dir(tmp_path, "{{ messages | tojson }}", "<|eot_id|>")
    messages = [{"role": "user", "content": "café <b>"}, {"role": "assistant", "content": "✓"}]
    assert ChatTokenizer(str(path)).render(messages) == hf_tokenizer(path).apply_chat_template(messages, tokenize=False)
