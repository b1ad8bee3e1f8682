"""Tokenizer directories built here with the real `tokenizers` library, shaped like a Llama-3 instruct
model's (BOS post-processor, eos <|eot_id|>, generation_config with two eos ids) and like a ChatML
model whose template marks assistant text with {% generation %}; and the reference for the token
pipeline's format tests, Megatron-LM's own reader and writer."""

import importlib.util
import json
import logging
import sys
import types

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Written for these tests in the shape of Llama-3-Instruct's template (one line; BOS before the
# first message; each turn's content trimmed; the assistant header as the generation prompt).
LLAMA3_TEMPLATE = (
    "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('Conversations start with system or user') }}"
    "{% endif %}{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# The same template with the assistant's text marked, for transformers' assistant mask (the oracle
# for the incremental span finding, which sees the unmarked one).
LLAMA3_MARKED = LLAMA3_TEMPLATE.replace(
    "{{ content }}",
    "{% if message['role'] == 'assistant' %}{{ content.split('<|end_header_id|>\n\n')[0] + '<|end_header_id|>\n\n' }}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}{{ content }}"
    "{% endif %}",
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|im_start|>", "<|im_end|>"]
CORPUS = ["You are a helpful assistant.", "Reverse the list: a b c d", "d c b a", "What is two plus two?",
          "Four.", "naïve café déjà vu ✓", "  spaced   out  ", "system user assistant", "Sort 3 1 2 please",
          "1 2 3", "Hello there! How can I help you today?"] * 20

CONVERSATIONS = [
    [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Four."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Reverse the list: a b c d"}, {"role": "assistant", "content": "d c b a"},
     {"role": "user", "content": "Sort 3 1 2 please"}, {"role": "assistant", "content": "  1 2 3 "}],
    [{"role": "user", "content": "naïve café"}, {"role": "assistant", "content": "déjà vu ✓"},
     {"role": "user", "content": "  spaced   out  "}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "Hello there!"}, {"role": "assistant", "content": "How can I help you today?"}],
]


def write_tokenizer_dir(path, template, eos_token, in_config=True):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    # BOS in the older AddedToken-object form, eos as a plain string: both occur in model repositories.
    bos_object = {"__type": "AddedToken", "content": bos, "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos_object, "eos_token": eos_token,
              "clean_up_tokenization_spaces": False}
    if in_config:
        config["chat_template"] = template
    else:
        (path / "chat_template.jinja").write_text(template)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tok.token_to_id("<|end_of_text|>"), tok.token_to_id(eos_token)]}))
    return path


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory):
    return write_tokenizer_dir(tmp_path_factory.mktemp("llama3"), LLAMA3_TEMPLATE, "<|eot_id|>")


@pytest.fixture(scope="session")
def llama3_marked_dir(tmp_path_factory):
    return write_tokenizer_dir(tmp_path_factory.mktemp("llama3m"), LLAMA3_MARKED, "<|eot_id|>")


@pytest.fixture(scope="session")
def chatml_dir(tmp_path_factory):
    return write_tokenizer_dir(tmp_path_factory.mktemp("chatml"), CHATML_TEMPLATE, "<|im_end|>", in_config=False)


@pytest.fixture(scope="session")
def hf_tokenizer():
    """transformers' AutoTokenizer for a directory: the oracle."""
    transformers = pytest.importorskip("transformers")
    return lambda path: transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def megatron():
    """megatron.core.datasets.indexed_dataset, the format's reference implementation (megatron-core,
    a test-only dependency). megatron/core/__init__.py imports most of Megatron (model parallel,
    optimizers: ~30 s); the dataset module needs only numpy, torch and two small helpers, so the
    package roots are stand-ins that only make the real submodules importable, and
    `megatron.core.utils` (which pulls in the parallel state) is replaced by its one logging helper
    the dataset module calls. Nothing of the format's code is replaced."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed (pip install megatron-core)")
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("megatron", root), ("megatron.core", f"{root}/core"),
                       ("megatron.core.datasets", f"{root}/core/datasets")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    if "megatron.core.utils" not in sys.modules:
        utils = types.ModuleType("megatron.core.utils")
        utils.log_single_rank = lambda logger, level, msg, *a, **k: logger.log(level, msg)
        sys.modules["megatron.core.utils"] = utils
    from megatron.core.datasets import indexed_dataset

    logging.getLogger(indexed_dataset.__name__).setLevel(logging.WARNING)
    return indexed_dataset


# Written for these tests in the format of Qwen2.5's template (ChatML turns; a default system turn;
# with tools, their JSON schemas in a <tools> block of the system turn; an assistant's calls as
# <tool_call> JSON; consecutive tool results as <tool_response> blocks of one user turn), using
# what such templates use: loop and namespace-free lookbehind, `is defined`, `is string`, tojson.
QWEN_STYLE_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nFunctions you may call, one JSON signature per line:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nTo call one, answer with <tool_call></tool_call> around {"name": ..., "arguments": ...}.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, now.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                                                "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "local_time", "description": "Local time in a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOL_CONVERSATIONS = [
    # Two calls in one turn (arguments as an object and as a JSON string), their two results, an answer.
    ({"tools": [WEATHER, TIME], "messages": [
        {"role": "user", "content": "Weather and time in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "C"}}},
            {"type": "function", "function": {"name": "local_time", "arguments": "{\"city\": \"Zürich\"}"}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "tool", "name": "local_time", "content": "14:05"},
        {"role": "assistant", "content": "21 °C, and it is 14:05."}]}),
    # A system turn of its own beside the tools, text before a call, then a plain follow-up turn.
    ({"tools": [WEATHER], "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Is it cold in Oslo?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "{\"temp\": -3}"},
        {"role": "assistant", "content": "Yes: -3 °C."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."}]}),
    # No tools: the default system turn.
    ({"messages": [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Four."}]}),
]


@pytest.fixture(scope="session")
def qwen_style_dir(tmp_path_factory):
    path = write_tokenizer_dir(tmp_path_factory.mktemp("qwen"), QWEN_STYLE_TEMPLATE, "<|im_end|>")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["bos_token"]  # Qwen's tokenizers have none; the template writes no BOS
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path
