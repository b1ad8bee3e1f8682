"""Packing tokenized conversations into fixed-length rows, and the per-token views of a row.

A row holds whole documents (conversations) one after another, then padding. Each token carries
the index of its document within the row (padding: -1), which is all the model needs to keep
documents apart: positions restart at 0 at each document, a token may attend only to earlier
tokens of its own document (the block-diagonal causal mask `model.block_causal_mask` builds), and
the last token of a document has no label, so nothing learns to predict the next document.

Rows are packed best-fit over a small window of open rows: each document goes to the open row with
the least room that still fits it; when none fits a new row opens, and past `window` open rows the
fullest one is closed. That fills rows far better than first-come next-fit while staying a
deterministic function of the document lengths in file order, done once when the cache is built,
so the rows (and every rank's view of them) never depend on the world size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IGNORE_INDEX = -100
"""Label of a position with no loss (the model's cross-entropy ignores it)."""


def fit_length(length: int, seq_len: int, overlong: str) -> int:
    """Tokens of a document that go into a row: all of them, its first seq_len (truncate), or 0 (drop)."""
    if length <= seq_len:
        return length
    return seq_len if overlong == "truncate" else 0


def pack(lengths: Sequence[int], seq_len: int, window: int = 32) -> list[list[int]]:
    """Document indices of each row, in row order; every length must be in [1, seq_len]."""
    rows: list[list[int]] = []
    open_rows: list[int] = []  # indices into rows
    free: list[int] = []       # room left in each open row, parallel to open_rows
    for doc, length in enumerate(lengths):
        best = -1
        for slot, room in enumerate(free):
            if length <= room and (best < 0 or room < free[best]):
                best = slot
        if best < 0:
            if len(open_rows) == window:
                fullest = min(range(window), key=free.__getitem__)
                del open_rows[fullest], free[fullest]
            rows.append([])
            open_rows.append(len(rows) - 1)
            free.append(seq_len)
            best = len(open_rows) - 1
        rows[open_rows[best]].append(doc)
        free[best] -= length
    return rows


def labels_and_positions(tokens: np.ndarray, docs: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token labels (already shifted: label[t] is token t+1) and positions of rows (..., seq_len).

    `loss` marks the tokens that are targets. A label exists where token t+1 is a target of the
    same document; elsewhere (prompts, a document's last token, padding) it is IGNORE_INDEX.
    """
    labels = np.full(tokens.shape, IGNORE_INDEX, dtype=np.int64)
    same_doc = (docs[..., 1:] == docs[..., :-1]) & (docs[..., 1:] >= 0)
    labels[..., :-1] = np.where(same_doc & (loss[..., 1:] != 0), tokens[..., 1:], IGNORE_INDEX)
    index = np.broadcast_to(np.arange(tokens.shape[-1]), tokens.shape)
    starts = np.ones(tokens.shape, dtype=bool)
    starts[..., 1:] = docs[..., 1:] != docs[..., :-1]
    positions = index - np.maximum.accumulate(np.where(starts, index, 0), axis=-1)
    return labels, positions.astype(np.int64)
