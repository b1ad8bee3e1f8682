"""The example's own model and data: nothing here knows about resilient_slurm.

The data is a stream of token sequences drawn from a fixed random bigram table, so a small model
has something to learn (its loss falls towards the table's entropy). A batch is a pure function of
(seed, position): the stream's whole state is the position, which is what makes a resume exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TinyLM(nn.Module):
    """A causal transformer of a few layers: embedding, blocks, a head tied to nothing."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean next-token loss (called through the module, so FSDP2 gathers the weights)."""
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class TokenStream:
    """Each rank's share of global batch k is rows [rank*b, (rank+1)*b) of it, b = global / world."""

    def __init__(self, seed: int, global_batch: int, seq: int, vocab: int, rank: int, world: int) -> None:
        self.seed, self.seq, self.vocab = seed, seq, vocab
        self.rows = global_batch // world
        self.first = rank * self.rows
        self.position = 0
        """Global batches consumed."""
        table = torch.Generator().manual_seed(seed)
        self.bigram = torch.softmax(3.0 * torch.randn(vocab, vocab, generator=table), dim=-1)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.position)
        self.position += 1
        batch = torch.empty(self.first + self.rows, self.seq + 1, dtype=torch.long)
        batch[:, 0] = torch.randint(self.vocab, (batch.shape[0],), generator=g)
        for t in range(1, self.seq + 1):
            batch[:, t] = torch.multinomial(self.bigram[batch[:, t - 1]], 1, generator=g).squeeze(1)
        mine = batch[self.first:]
        return mine[:, :-1], mine[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
