import pytest

from resilient_slurm.checkpoint.chunks import Box
from resilient_slurm.checkpoint.layout import (
    Chunk,
    ChunkFile,
    TensorSpec,
    index_chunks,
    parse_step_dir,
    shards_index,
    step_dir_name,
)


@pytest.mark.parametrize(
    "name, step",
    [("step_00000100", 100), ("step_123456789", 123456789), ("step_100", None), (".tmp.step_00000100", None),
     ("step_0000010x", None), ("latest", None)],
)
def test_parse_step_dir(name, step):
    assert parse_step_dir(name) == step


def test_step_dir_round_trip():
    assert parse_step_dir(step_dir_name(42)) == 42


def test_shards_index_lists_every_chunk_of_every_tensor_and_reads_back():
    specs = [TensorSpec("w", (4, 6), "F32", 4), TensorSpec("step", (), "F32", 4)]
    files = [ChunkFile("model-00001-of-00002.safetensors", 0, (Chunk("w", Box((0, 0), (4, 3))), Chunk("step", Box((), ())))),
             ChunkFile("model-00002-of-00002.safetensors", 1, (Chunk("w", Box((0, 3), (4, 3))),))]
    index = shards_index(specs, files)
    assert index["tensors"]["w"] == {"shape": [4, 6], "dtype": "F32", "chunks": [
        ["model-00001-of-00002.safetensors", [0, 0], [4, 3]], ["model-00002-of-00002.safetensors", [0, 3], [4, 3]]]}
    assert index_chunks(index["tensors"]["w"]) == [("model-00001-of-00002.safetensors", Box((0, 0), (4, 3))),
                                                   ("model-00002-of-00002.safetensors", Box((0, 3), (4, 3)))]
    assert index_chunks(index["tensors"]["step"]) == [("model-00001-of-00002.safetensors", Box((), ()))]


@pytest.mark.parametrize("entry, chunks", [
    # version 2: pieces of rows [file, start, stop] are boxes that span the other dimensions
    ({"shape": [10, 3], "pieces": [["a", 0, 5], ["b", 5, 10]]}, [("a", Box((0, 0), (5, 3))), ("b", Box((5, 0), (5, 3)))]),
    ({"shape": [7], "pieces": [["a", 0, 7]]}, [("a", Box((0,), (7,)))]),
    # a scalar's one piece (rows 0..1) is its whole, dimensionless box
    ({"shape": [], "pieces": [["a", 0, 1]]}, [("a", Box((), ()))]),
])
def test_version_2_pieces_read_as_boxes(entry, chunks):
    assert index_chunks(entry) == chunks


def test_a_chunk_with_the_wrong_number_of_dimensions_is_malformed():
    with pytest.raises(ValueError, match="dimensions"):
        index_chunks({"shape": [4, 4], "chunks": [["a", [0], [4]]]})
