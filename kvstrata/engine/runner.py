"""ModelRunner: turn a ScheduledBatch into tensors, run the model, sample next tokens."""
from __future__ import annotations

import torch

from kvstrata.engine.grammar import GrammarBackend
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.kv.pool import PagePool
from kvstrata.model.attention import AttentionMetadata, PrefillSeq
from kvstrata.model.cascade_attention import shared_leading_pages
from kvstrata.model.llama import LlamaModel
from kvstrata.model.sampler import SampleSpec, sample


DECODE_PAD_TOKENS = 64


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: PagePool) -> None:
        self.model = model
        self.pool = pool
        self.device = model.device
        self.page_size = pool.page_size
        self.grammar: GrammarBackend | None = None  # set by the engine

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """input ids [T], positions [T], attention metadata, rows to sample [S]."""
        ps = self.page_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefill: list[PrefillSeq] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        logit_rows: list[int] = []
        row = 0
        for i, (req, n) in enumerate(zip(batch.requests, batch.num_tokens)):
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            ids.extend(req.token_ids[start:end])
            positions.extend(range(start, end))
            pages = req.pages[: -(-end // ps)]
            slots.extend(pages[p // ps] * ps + p % ps for p in range(start, end))
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(pages)
                decode_lens.append(end)
            else:
                prefill.append(PrefillSeq(q_start=row, q_len=n, kv_len=end, pages=self._tensor(pages)))
            row += n
            if batch.samples(i):
                logit_rows.append(row - 1)
        meta = AttentionMetadata(page_size=ps, slot_mapping=self._tensor(slots), prefill=prefill)
        if decode_rows:
            # pad the page tables to a multiple of 64 tokens: the bf16 matmuls of decode attention
            # (oneDNN) build a kernel per new shape, ~0.6 ms each, so a context length that changes
            # every step would pay that every step; padding (masked) changes the shape every 64 tokens
            pad = max(1, DECODE_PAD_TOKENS // ps)
            pmax = -(-max(len(t) for t in decode_tables) // pad) * pad
            meta.decode_rows = self._tensor(decode_rows)
            meta.decode_pages = self._tensor([t + [0] * (pmax - len(t)) for t in decode_tables])  # [B, Pmax]
            lens = self._tensor(decode_lens)
            meta.decode_mask = (torch.arange(pmax * ps, device=self.device)[None, :] < lens[:, None])[:, None, None, :]
            meta.decode_lens = decode_lens
            meta.decode_shared_pages = shared_leading_pages(decode_tables, decode_lens, ps)
        return self._tensor(ids), self._tensor(positions), meta, self._tensor(logit_rows)

    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """Next token for each request that reaches the end of its tokens, else None."""
        input_ids, positions, meta, rows = self.prepare(batch)
        logits = self.model.forward(input_ids, positions, meta, self.pool.k, self.pool.v, rows)
        specs = [
            SampleSpec(r.params.temperature, r.params.top_p, r.params.top_k, r.generator)
            for i, r in enumerate(batch.requests)
            if batch.samples(i)
        ]
        if self.grammar is not None:  # constrained requests: forbidden tokens to -inf on their rows
            logits = self.grammar.mask_logits(logits, [r.matcher for i, r in enumerate(batch.requests) if batch.samples(i)])
        sampled = iter(sample(logits, specs) if specs else [])
        return [next(sampled) if batch.samples(i) else None for i in range(len(batch))]
