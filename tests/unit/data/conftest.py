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
