"""The embedding of a model without dense copies (kvstrata/model/embed_head.py): a prompt's rows are
read from the file, a decode step's few through the map."""
from __future__ import annotations

import torch

from kvstrata.model.embed_head import Embedding
from kvstrata.model.quant.gguf_rows import READ_MIN_ROWS


class Rows:
    """A stand-in for GgufRows that says which way each call read."""

    def __init__(self) -> None:
        self.ways: list[str] = []

    def __call__(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        self.ways.append("map")
        return ids.to(dtype)[:, None].repeat(1, 4)

    def read(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        self.ways.append("read")
        return ids.to(dtype)[:, None].repeat(1, 4)


def test_a_prompts_rows_are_read_and_a_decode_steps_mapped() -> None:
    rows = Rows()
    emb = Embedding(None, rows, torch.float32)  # type: ignore[arg-type]
    small, large = torch.arange(READ_MIN_ROWS), torch.arange(READ_MIN_ROWS + 1)
    assert torch.equal(emb(small)[:, 0], small.float()) and torch.equal(emb(large)[:, 0], large.float())
    assert rows.ways == ["map", "read"]
