"""The token embedding and the LM head, dense or read from the GGUF file.

A dense model holds both as [V, hidden] tensors (one, when tied). A GGUF loaded without dense copies
holds the embedding as rows of the file (quant/gguf_rows.py: a step reads its tokens' rows) and
the head quantized, int8 (quant/int8_head.py) or with `head_bits` 4 in 4-bit blocks (quant/q4_head.py),
whose top candidates per row are rescored from the file's rows. Narrow steps of a quantized model use
the quantized head either way; wide steps use the dense head when there is one.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from kvstrata.model.quant.gguf_rows import GgufRows
from kvstrata.model.quant.int8_head import RESCORE_TOP, Int8Head, int8_head_supported
from kvstrata.model.quant.q4_head import WIDE_RESCORE, Q4Head, q4_head_packable

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
                 dtype: torch.dtype, head_bits: int = 8) -> None:
        """`quantized`: the model runs quantized linears (narrow steps then take the quantized head);
        `int_dot`: our integer-dot kernels where they can run (else torch's int8 kernel); `head_bits` 4:
        the 4-bit candidate head (q4_head.py, on those kernels), else int8."""
        if dense is None and (rows is None or not int8_head_supported()):
            assert rows is not None, "a head needs dense weights or the file's rows"
            dense = rows.chunk(0, rows.shape[0], dtype)  # no int8 kernel here: the dense head after all
        self.dense, self.rows = dense, rows
        self.quant: Int8Head | Q4Head | None = None
        if (quantized or dense is None) and int8_head_supported():
            source, vocab, hidden = self.exact_source()
            four = head_bits == 4 and int_dot and q4_head_packable(vocab, hidden)

            def build() -> dict[str, torch.Tensor]:
                head = Q4Head.from_rows(source, vocab, hidden) if four else Int8Head.from_rows(source, vocab, hidden, int_dot)
                if rows is not None and dense is None:
                    rows.drop_pages()  # read whole once; later only a step's candidate rows
                return head.tensors()

            group = "q4head-intdot" if four else "int8head-intdot" if int_dot else "int8head"
            cache = rows.cache if rows is not None and dense is None else None
            built = cache.get_or_build(group, build) if cache else build()
            self.quant = Q4Head.of_tensors(built) if four else Int8Head.of_tensors(built)

    def exact_source(self) -> tuple[Callable[[int, int], torch.Tensor], int, int]:
        """(rows(start, stop) -> the exact head's rows [stop - start, hidden] in float, vocab, hidden): the
        dense head's, else the file's; what a quantized head is built from."""
        dense, rows = self.dense, self.rows
        if dense is not None:
            return (lambda start, stop: dense[start:stop]), dense.shape[0], dense.shape[1]
        assert rows is not None
        return rows.chunk, rows.shape[0], rows.shape[1]

    @property
    def bits(self) -> int | None:
        """The quantized head's bits (4 or 8), None without one."""
        return None if self.quant is None else 4 if isinstance(self.quant, Q4Head) else 8

    def __call__(self, x: torch.Tensor, narrow: bool, wide_rescore: bool = False) -> torch.Tensor:
        """[S, hidden] -> [S, V] float32. `wide_rescore`: the step samples or constrains some row, so the
        4-bit head rescores more candidates (WIDE_RESCORE: its tail is further from the exact logits)."""
        if self.quant is not None and (narrow or self.dense is None):
            top = WIDE_RESCORE if wide_rescore and isinstance(self.quant, Q4Head) else RESCORE_TOP
            return self.quant.logits(x, self.dense if self.dense is not None else self._exact_rows, top)
        assert self.dense is not None
        return F.linear(x, self.dense).float()

    def _exact_rows(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None
        return self.rows(ids, torch.float32)
