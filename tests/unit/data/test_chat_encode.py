import numpy as np
import pytest

from resilient_slurm.data.chat.encode import RenderedChat, encode_chat, render_chat
from resilient_slurm.data.chat_template import ChatTemplate, TemplateRenderError
from resilient_slurm.data.tokenizer import ChatTokenizer
from tests.unit.data.conftest import CONVERSATIONS


def encoded(tok, messages, mode):
    rendered = render_chat(tok.template, messages)
    enc = tok.encode(rendered.text)
    return encode_chat(rendered, enc.ids, enc.offsets, mode, tok.eos_ids)


def transformers_assistant_mask(hf, messages):
    out = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return np.array(out["assistant_masks"], dtype=bool)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_incremental_spans_equal_transformers_generation_mask(messages, llama3_dir, llama3_marked_dir, hf_tokenizer):
    # Our incremental method on the plain template vs transformers' mask on the same template with
    # {% generation %} around each assistant reply (content through <|eot_id|>).
    ours = encoded(ChatTokenizer(str(llama3_dir)), messages, "assistant")
    theirs = transformers_assistant_mask(hf_tokenizer(llama3_marked_dir), messages)
    assert ours.ids.tolist() == hf_tokenizer(llama3_marked_dir).apply_chat_template(messages, return_dict=False)
    np.testing.assert_array_equal(ours.loss, theirs)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_generation_markers_give_transformers_mask(messages, chatml_dir, hf_tokenizer):
    ours = encoded(ChatTokenizer(str(chatml_dir)), messages, "assistant")
    np.testing.assert_array_equal(ours.loss, transformers_assistant_mask(hf_tokenizer(chatml_dir), messages))


def test_the_three_loss_modes_on_a_multi_turn_conversation(llama3_dir):
    tok = ChatTokenizer(str(llama3_dir))
    messages = CONVERSATIONS[1]  # system, user, assistant, user, assistant
    assistant, last, everything = (encoded(tok, messages, mode) for mode in ("assistant", "last", "all"))
    text = lambda mask: tok.decode(assistant.ids[mask].tolist())
    assert text(assistant.loss) == "d c b a<|eot_id|>1 2 3<|eot_id|>"
    assert text(last.loss) == "1 2 3<|eot_id|>"
    assert everything.loss.all() and len(everything.loss) == len(assistant.ids)
    # Only assistant text is ever trained in `last` and `assistant`; `last` is a subset.
    assert not (last.loss & ~assistant.loss).any() and last.loss.sum() < assistant.loss.sum()


def test_the_exact_match_sample_is_the_generation_prompt_and_the_last_reply(llama3_dir):
    tok = ChatTokenizer(str(llama3_dir))
    messages = CONVERSATIONS[1]
    e = encoded(tok, messages, "assistant")
    assert e.ids[: e.prompt_len].tolist() == tok.apply_chat_template(messages[:-1], add_generation_prompt=True)
    target = e.ids[e.prompt_len : e.prompt_len + e.target_len].tolist()
    assert tok.decode(target) == "1 2 3<|eot_id|>" and target[-1] in tok.eos_ids


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_reason():
    # Drops earlier assistant replies once a later turn follows (as reasoning templates do with thoughts).
    source = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[..]{% else %}"
              "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}assistant: {% endif %}")
    template = ChatTemplate(source, "test", {})
    with pytest.raises(TemplateRenderError, match="generation"):
        render_chat(template, CONVERSATIONS[1])
    assert render_chat(template, CONVERSATIONS[0]).spans  # one turn: nothing is rewritten


def test_token_spans_survive_whitespace_trimmed_offsets():
    # A space-only token whose offsets a trimming tokenizer reports as empty at its end stays with
    # the text before a span that starts right after it.
    rendered_spans = [(4, 6)]
    offsets = [(0, 3), (4, 4), (4, 6), (6, 7)]  # token 1 really covers (3, 4)
    e = encode_chat(RenderedChat("abc xy.", rendered_spans), [1, 2, 3, 4], offsets, "assistant", (4,))
    assert e.loss.tolist() == [False, False, True, False] and e.prompt_len == 2
