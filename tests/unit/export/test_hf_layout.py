"""The Hugging Face directory's layout as data: shard planning, the index, which base files travel."""

import pytest

from resilient_slurm.config import ModelConfig
from resilient_slurm.export.hf_layout import config_from_base, copied, generation_config, index, plan_shards


@pytest.mark.parametrize("sizes, limit, files", [
    ([("a", 3), ("b", 3), ("c", 5), ("d", 1)], 6, [["a", "b"], ["c", "d"]]),
    ([("a", 3), ("b", 9), ("c", 2)], 6, [["a"], ["b"], ["c"]]),  # a tensor over the limit stands alone
    ([("a", 3), ("b", 3)], 6, [["a", "b"]]),
    ([("a", 7)], 6, [["a"]]),
])
def test_plan_shards_fills_files_in_order_up_to_the_limit(sizes, limit, files):
    shards = plan_shards(sizes, limit)
    assert [list(s.names) for s in shards] == files
    assert sum(s.nbytes for s in shards) == sum(b for _, b in sizes)
    if len(files) == 1:
        assert shards[0].file == "model.safetensors"
    else:
        assert [s.file for s in shards] == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                                            for i in range(1, len(files) + 1)]


def test_index_maps_every_tensor_to_its_file():
    shards = plan_shards([("a", 3), ("b", 3), ("c", 5)], 6)
    assert index(shards) == {"metadata": {"total_size": 11}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}}


@pytest.mark.parametrize("path, travels", [
    ("tokenizer.json", True), ("tokenizer_config.json", True), ("special_tokens_map.json", True),
    ("chat_template.jinja", True), ("generation_config.json", True), ("README.md", True), ("LICENSE", True),
    ("original/tokenizer.model", True), ("original/params.json", True),
    ("config.json", False), ("model.safetensors", False), ("model-00001-of-00004.safetensors", False),
    ("model.safetensors.index.json", False), ("pytorch_model.bin", False), ("pytorch_model.bin.index.json", False),
    ("original/consolidated.00.pth", False), (".gitattributes", False), (".cache/huggingface/download/x", False),
])
def test_which_base_files_travel(path, travels):
    assert copied(path) is travels


def test_config_from_base_changes_only_the_dtype_keys_it_has():
    classic = {"model_type": "llama", "torch_dtype": "float32", "rope_scaling": {"rope_type": "llama3"}}
    assert config_from_base(classic, "bfloat16") == {**classic, "torch_dtype": "bfloat16"}
    assert config_from_base({"model_type": "llama"}, "bfloat16") == {
        "model_type": "llama", "torch_dtype": "bfloat16", "dtype": "bfloat16"}


def test_generation_config_writes_one_eos_as_an_int_and_several_as_a_list():
    assert generation_config(ModelConfig(bos_token_id=1, eos_token_id=[2])) == {"eos_token_id": 2, "bos_token_id": 1}
    assert generation_config(ModelConfig(eos_token_id=[2, 3])) == {"eos_token_id": [2, 3]}
