"""The token embedding and the LM head, dense or read from the GGUF file.

A dense model holds both as [V, hidden] tensors (one, when tied). A GGUF loaded without dense copies
holds the embedding as rows of the file (quant/gguf_rows.py: a step reads its tokens' rows) and
the head as int8 (quant/int8_head.py) whose top candidates per row are rescored from the file's rows.
Narrow steps of a quantized model use the int8 head either way; wide steps use the dense head when
there is one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvstrata.model.quant.gguf_rows import GgufRows
from kvstrata.model.quant.int8_head import Int8Head, int8_head_supported

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


class Embedding:
    def __init__(self, dense: torch.Tensor | None, rows: GgufRows | None, dtype: torch.dtype) -> None:
        assert dense is not None or rows is not None
        self.dense, self.rows, self.dtype = dense, rows, dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        if self.dense is not None:
            return F.embedding(ids, self.dense)
        assert self.rows is not None
        return self.rows(ids.cpu(), self.dtype).to(ids.device)


class Head:
    def __init__(self, dense: torch.Tensor | None, rows: GgufRows | None, quantized: bool, int_dot: bool,
                 dtype: torch.dtype) -> None:
        """`quantized`: the model runs quantized linears (narrow steps then take the int8 head);
        `int_dot`: our int8 kernel where it can run (else torch's)."""
        if dense is None and (rows is None or not int8_head_supported()):
            assert rows is not None, "a head needs dense weights or the file's rows"
            dense = rows.chunk(0, rows.shape[0], dtype)  # no int8 kernel here: the dense head after all
        self.dense, self.rows = dense, rows
        self.int8: Int8Head | None = None
        if (quantized or dense is None) and int8_head_supported():
            if dense is not None:
                self.int8 = Int8Head.quantize(dense, int_dot)
            else:
                assert rows is not None
                r = rows

                def build() -> dict[str, torch.Tensor]:
                    head = Int8Head.from_rows(r.chunk, r.shape[0], r.shape[1], int_dot)
                    r.drop_pages()  # read whole once; later only a step's candidate rows
                    return head.tensors()

                group = "int8head-intdot" if int_dot else "int8head"
                self.int8 = Int8Head.of_tensors(rows.cache.get_or_build(group, build) if rows.cache else build())

    def __call__(self, x: torch.Tensor, narrow: bool) -> torch.Tensor:  # [S, hidden] -> [S, V] float32
        if self.int8 is not None and (narrow or self.dense is None):
            return self.int8.logits(x, self.dense if self.dense is not None else self._exact_rows)
        assert self.dense is not None
        return F.linear(x, self.dense).float()

    def _exact_rows(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None
        return self.rows(ids, torch.float32)
