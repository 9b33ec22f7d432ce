"""ModelRunner: turn a ScheduledBatch into tensors, run the model, sample next tokens."""
from __future__ import annotations

import torch

from kvstrata.engine.request import Request
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.kv.pool import PagePool
from kvstrata.model.attention import AttentionMetadata, PrefillSeq
from kvstrata.model.llama import LlamaModel
from kvstrata.model.sampler import SampleSpec, sample


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: PagePool) -> None:
        self.model = model
        self.pool = pool
        self.device = model.device
        self.page_size = pool.page_size
        self._offsets = torch.arange(pool.page_size, device=self.device)

    def _slots(self, req: Request, start: int, end: int) -> torch.Tensor:
        """[end - start] long: pool slots of the request's positions [start, end)."""
        ps = self.page_size
        first, last = start // ps, -(-end // ps)
        pages = torch.tensor(req.pages[first:last], dtype=torch.long, device=self.device)
        slots = (pages[:, None] * ps + self._offsets[None, :]).reshape(-1)  # [pages * ps]
        return slots[start - first * ps : end - first * ps]

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        slot_mapping: list[torch.Tensor] = []
        prefill: list[PrefillSeq] = []
        decode_rows: list[int] = []
        decode_slots: list[torch.Tensor] = []
        logit_rows: list[int] = []
        row = 0
        for i, (req, n) in enumerate(zip(batch.requests, batch.num_tokens)):
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            ids.extend(req.token_ids[start:end])
            positions.append(torch.arange(start, end, device=self.device))
            ctx = self._slots(req, 0, end)  # [end]
            slot_mapping.append(ctx[start:end])
            if n == 1:
                decode_rows.append(row)
                decode_slots.append(ctx)
            else:
                prefill.append(PrefillSeq(q_start=row, q_len=n, slots=ctx))
            row += n
            if batch.samples(i):
                logit_rows.append(row - 1)
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slot_mapping),
            prefill=prefill,
            decode_rows=None,
            decode_slots=None,
            decode_mask=None,
        )
        if decode_rows:
            lmax = max(s.shape[0] for s in decode_slots)
            padded = torch.zeros(len(decode_slots), lmax, dtype=torch.long, device=self.device)
            mask = torch.zeros(len(decode_slots), 1, 1, lmax, dtype=torch.bool, device=self.device)
            for b, s in enumerate(decode_slots):
                padded[b, : s.shape[0]] = s
                mask[b, 0, 0, : s.shape[0]] = True
            meta.decode_rows = torch.tensor(decode_rows, dtype=torch.long, device=self.device)
            meta.decode_slots = padded  # [B, Lmax]
            meta.decode_mask = mask  # [B, 1, 1, Lmax]
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        rows = torch.tensor(logit_rows, dtype=torch.long, device=self.device)
        return input_ids, torch.cat(positions), meta, rows

    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """Next token for each request that reaches the end of its tokens, else None."""
        input_ids, positions, meta, rows = self.prepare(batch)
        logits = self.model.forward(input_ids, positions, meta, self.pool.k, self.pool.v, rows)
        specs = [
            SampleSpec(r.params.temperature, r.params.top_p, r.params.top_k, r.generator)
            for i, r in enumerate(batch.requests)
            if batch.samples(i)
        ]
        sampled = iter(sample(logits, specs) if specs else [])
        return [next(sampled) if batch.samples(i) else None for i in range(len(batch))]
