"""The Megatron format against Megatron's own code, and every bad file refused in one line."""

import struct

import numpy as np
import pytest

from resilient_slurm.data.tokens.corpus import ArrayFile, MegatronFile, open_token_file
from resilient_slurm.data.tokens.errors import TokenDataError
from resilient_slurm.data.tokens.idx_format import DTYPE_CODES, HEADER_BYTES, token_dtype
from resilient_slurm.data.tokens.sources import Source, find_files

from tests.token_corpora import numbered_docs, write_prefix


def documents_of(f: MegatronFile):
    """Our reader's documents: the token ranges between its document starts."""
    tokens = f.read(0, f.num_tokens)
    starts = [0, *f.doc_starts(0, tokens).tolist(), f.num_tokens]
    return [tokens[a:b] for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_a_corpus_megatron_wrote_is_read_document_for_document(megatron, tmp_path, dtype):
    docs = numbered_docs(50, 3, vocab=60000 if dtype == np.uint16 else 120000)
    builder = megatron.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=dtype)
    for doc in docs:
        builder.add_document(doc, [len(doc)])
    builder.finalize(str(tmp_path / "ref.idx"))
    ours = MegatronFile(str(tmp_path / "ref"))
    assert ours.dtype == np.dtype(dtype).name and ours.num_tokens == sum(map(len, docs))
    assert [d.tolist() for d in documents_of(ours)] == [d.tolist() for d in docs]


def test_documents_of_several_sentences_start_at_their_first_sentence(megatron, tmp_path):
    """--split-sentences: a document is several sequences; only its first begins a document."""
    builder = megatron.IndexedDatasetBuilder(str(tmp_path / "s.bin"), dtype=np.uint16)
    docs = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15]]
    for doc, split in zip(docs, ([2, 3], [2], [1, 1, 2])):
        builder.add_document(np.array(doc), split)
    builder.finalize(str(tmp_path / "s.idx"))
    assert [d.tolist() for d in documents_of(MegatronFile(str(tmp_path / "s")))] == docs


def test_what_our_writer_writes_megatron_reads_back_identically(megatron, tmp_path):
    docs = numbered_docs(40, 4)
    prefix = write_prefix(tmp_path / "ours", docs)
    ref = megatron.IndexedDataset(prefix)
    assert len(ref) == len(docs)
    assert all(np.array_equal(ref[i], d) for i, d in enumerate(docs))
    assert ref.index.dtype == np.uint16 and list(ref.document_indices) == list(range(len(docs) + 1))


def test_the_token_dtype_is_megatrons_choice(megatron):
    for vocab in (512, 65499, 65500, 128256):
        assert token_dtype(vocab) == np.dtype(megatron.DType.optimal_dtype(vocab)).name
    assert DTYPE_CODES == {d.value: d.name for d in megatron.DType}


def _rewrite(path, offset, data):
    raw = bytearray(open(path, "rb").read())
    raw[offset:offset + len(data)] = data
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("damage, message", [
    (lambda p: open(p + ".idx", "r+b").truncate(20), "truncated: 20 bytes"),
    (lambda p: open(p + ".idx", "r+b").truncate(HEADER_BYTES + 10), "the file is truncated"),
    (lambda p: _rewrite(p + ".idx", 0, b"NOTMAGIC!"), "not a Megatron .idx (magic"),
    (lambda p: _rewrite(p + ".idx", 17, bytes([9])), "unknown dtype code 9"),
    (lambda p: _rewrite(p + ".idx", 17, bytes([7])), "dtype code 7 (float32) cannot hold token ids"),
    (lambda p: _rewrite(p + ".idx", 9, struct.pack("<Q", 2)), ".idx version 2"),
    (lambda p: open(p + ".bin", "ab").write(b"\0\0"), "the .idx does not belong to this .bin"),
    (lambda p: __import__("os").remove(p + ".bin"), "missing; a Megatron dataset needs both"),
])
def test_a_bad_pair_is_refused_in_one_line_naming_the_file(tmp_path, damage, message):
    prefix = write_prefix(tmp_path / "d", numbered_docs(10, 5))
    damage(prefix)
    with pytest.raises(TokenDataError) as e:
        MegatronFile(prefix)
    assert message in str(e.value) and prefix in str(e.value) and "\n" not in str(e.value)


def test_pointers_that_are_not_back_to_back_are_found_by_the_scan(tmp_path):
    prefix = write_prefix(tmp_path / "g", numbered_docs(10, 6))
    f = MegatronFile(prefix)
    _rewrite(prefix + ".idx", f.header.pointers_offset + 8 * 3, struct.pack("<q", 2))
    with pytest.raises(TokenDataError, match="sequence 3 starts at byte 2"):
        MegatronFile(prefix).scan()


def test_headerless_arrays_are_read_with_their_declared_dtype_and_split_at_eos(tmp_path):
    tokens = np.array([7, 8, 1, 9, 10, 11, 1, 12, 1], np.uint32)
    tokens.tofile(tmp_path / "part.npy")  # as OLMo-core writes it: raw, despite the name
    f = open_token_file(str(tmp_path / "part.npy"), "uint32", eos_id=1)
    assert f.read(0, 9).tolist() == tokens.tolist() and f.doc_starts(0, f.read(0, 9)).tolist() == [3, 7]
    assert f.doc_starts(3, f.read(3, 9)).tolist() == [4]
    np.save(tmp_path / "real.npy", tokens.astype(np.uint16))  # a real .npy is read through its header
    assert open_token_file(str(tmp_path / "real.npy"), None, 1).read(2, 5).tolist() == [1, 9, 10]


@pytest.mark.parametrize("write, dtype, message", [
    (lambda p: np.arange(5, dtype=np.uint16).tofile(p), None, "needs its dtype; set dtype"),
    (lambda p: np.arange(5, dtype=np.uint16).tofile(p), "uint32", "10 bytes of tokens is not a multiple of 4"),
    (lambda p: np.save(p, np.arange(5, dtype=np.uint16)), "uint32", "its numpy header says uint16"),
    (lambda p: np.arange(5, dtype=np.float32).tofile(p), "float32", "dtype float32 is not a token type"),
])
def test_a_bad_array_is_refused_in_one_line(tmp_path, write, dtype, message):
    path = str(tmp_path / "a.npy")
    write(path)
    with pytest.raises(TokenDataError, match=message):
        ArrayFile(path, dtype, 1)


def test_a_source_reads_across_its_files_as_one_stream(tmp_path):
    a, b = numbered_docs(5, 7), numbered_docs(4, 8)
    write_prefix(tmp_path / "s_000", a)
    write_prefix(tmp_path / "s_001", b)
    (tmp_path / "notes.txt").write_text("ignored")
    paths = find_files("k", str(tmp_path))
    assert paths == [str(tmp_path / "s_000"), str(tmp_path / "s_001")] == find_files("k", str(tmp_path / "s_*"))
    source = Source("s", 1.0, [MegatronFile(p) for p in paths])
    whole = np.concatenate(a + b)
    tokens, begins = source.read(3, len(whole) - 2)
    assert tokens.tolist() == whole[3:-2].tolist()
    ends = np.cumsum([len(d) for d in a + b])[:-1]
    assert np.flatnonzero(begins).tolist() == (ends - 3).tolist()  # every document start, the file's too
    with pytest.raises(TokenDataError, match="holds no token files"):
        find_files("data.sources[x].path", str(tmp_path / "nothing*"))
