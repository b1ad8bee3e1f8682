"""The Megatron-LM indexed dataset's `.idx` layout: its header, its dtype codes, where each array
lies, and the size a consistent pair of files has.

A dataset is a prefix with two files. `PREFIX.bin` holds every token of every document back to
back, with no header and no separators. `PREFIX.idx` is little-endian:

    offset  size   content
    0       9      magic b"MMIDIDX\\x00\\x00"
    9       8      version, u64 = 1
    17      1      dtype code of the tokens in .bin, u8 (DTYPE_CODES)
    18      8      sequence count S, u64
    26      8      document count D, u64 (documents + 1: the list starts with 0)
    34      4*S    sequence lengths, int32
    34+4S   8*S    sequence byte offsets into .bin, int64
    34+12S  8*D    document indices, int64: the sequence at which each document ends
    34+12S+8D  S   sequence modes, int8 (multimodal datasets only; optional)

A sequence is a document, or a sentence of one with Megatron's `--split-sentences`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from resilient_slurm.data.tokens.errors import TokenDataError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34
_HEADER = struct.Struct("<9sQBQQ")

DTYPE_CODES: dict[int, str] = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64",
                               7: "float32", 8: "uint16"}
"""Every code Megatron's `DType` defines, and its numpy dtype."""
TOKEN_DTYPES = ("uint8", "int16", "uint16", "int32", "int64")
"""Codes whose values can be token ids; the rest (int8, the floats) are refused by name."""
ITEMSIZE = {"uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class IdxHeader:
    dtype: str
    """numpy dtype name of the tokens in .bin."""
    sequences: int
    documents: int
    """Entries of the document index: documents + 1."""

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def lengths_offset(self) -> int:
        return HEADER_BYTES

    @property
    def pointers_offset(self) -> int:
        return HEADER_BYTES + 4 * self.sequences

    @property
    def documents_offset(self) -> int:
        return HEADER_BYTES + 12 * self.sequences

    def sizes_ok(self, idx_bytes: int) -> bool:
        """An .idx of this header is exactly this long, with or without the multimodal modes."""
        base = HEADER_BYTES + 12 * self.sequences + 8 * self.documents
        return idx_bytes in (base, base + self.sequences)


def parse_header(raw: bytes, path: str) -> IdxHeader:
    """The header of the .idx at `path` from its first bytes; TokenDataError names what is wrong."""
    if len(raw) < HEADER_BYTES:
        raise TokenDataError(f"{path}: truncated: {len(raw)} bytes, a Megatron .idx header has {HEADER_BYTES}; "
                             "rewrite it (python -m resilient_slurm.data tokenize)")
    magic, version, code, sequences, documents = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise TokenDataError(f"{path}: not a Megatron .idx (magic {magic!r}, expected {MAGIC!r}); point the source "
                             "at the prefix of a .bin/.idx pair")
    if version != VERSION:
        raise TokenDataError(f"{path}: .idx version {version}, only version {VERSION} exists; rewrite the file")
    if code not in DTYPE_CODES:
        raise TokenDataError(f"{path}: unknown dtype code {code} (Megatron defines "
                             f"{', '.join(f'{c} {n}' for c, n in DTYPE_CODES.items())}); rewrite the file")
    dtype = DTYPE_CODES[code]
    if dtype not in TOKEN_DTYPES:
        raise TokenDataError(f"{path}: dtype code {code} ({dtype}) cannot hold token ids; tokens are "
                             f"{', '.join(TOKEN_DTYPES)}; rewrite the file")
    if documents < 1:
        raise TokenDataError(f"{path}: document count 0, a valid .idx has at least 1 (the leading 0); rewrite it")
    return IdxHeader(dtype, sequences, documents)


def encode_header(dtype: str, sequences: int, documents: int) -> bytes:
    code = next(c for c, name in DTYPE_CODES.items() if name == dtype)
    return _HEADER.pack(MAGIC, VERSION, code, sequences, documents)


def token_dtype(vocab_size: int) -> str:
    """Megatron's choice (`DType.optimal_dtype`): uint16 below 65,500 ids, else int32."""
    return "uint16" if vocab_size < 65500 else "int32"
