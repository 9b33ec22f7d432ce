"""ModelRunner: turn a ScheduledBatch into tensors, run the model, sample next tokens."""
from __future__ import annotations

import itertools
from array import array

import torch

from kvstrata.engine.grammar import GrammarBackend
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.engine.spec.verify import accept
from kvstrata.kv.pool import PagePool
from kvstrata.model.attention import AttentionMetadata, PrefillSeq
from kvstrata.model.cascade_attention import shared_leading_pages
from kvstrata.model.llama import LlamaModel
from kvstrata.model.sampler import SampleSpec, sample


DECODE_PAD_TOKENS = 64


def slot_range(pages: list[int], start: int, end: int, ps: int) -> itertools.chain[int]:
    """Pool slots of token positions [start, end) of a sequence with page table `pages`: one range
    per page touched."""
    first, last = start // ps, (end - 1) // ps
    return itertools.chain.from_iterable(
        range(pages[p] * ps + (start - p * ps if p == first else 0), pages[p] * ps + (end - p * ps if p == last else ps))
        for p in range(first, last + 1)
    )


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: PagePool) -> None:
        self.model = model
        self.pool = pool
        self.device = model.device
        self.page_size = pool.page_size
        self.grammar: GrammarBackend | None = None  # set by the engine

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """input ids [T], positions [T], attention metadata, rows to sample [S].

        The Python loops are per request and per page, not per token, and every integer the step
        needs goes to the device in one tensor (one conversion, one copy) whose views are the
        step's index tensors: at small batches each extra torch op costs more than the data."""
        ps = self.page_size
        ids: list[int] = []
        positions: list[int] = []
        flat: list[int] = []  # every request's page table, one after another
        slots: list[int] = []  # where each new token's K/V goes
        prefill: list[tuple[int, int, int, int, int]] = []  # q_start, q_len, kv_len, first page, pages
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        logit_rows: list[int] = []
        row = 0
        for i, (req, n) in enumerate(zip(batch.requests, batch.num_tokens)):
            draft = batch.draft(i)  # verified after the request's last token: one more row each
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            ids.extend(req.token_ids[start : end - len(draft)])
            ids.extend(draft)
            positions.extend(range(start, end))
            npg = -(-end // ps)
            if n == 1 + len(draft):  # a decode row, or a verify step: a decode row per token, each seeing those before it
                decode_rows.extend(range(row, row + n))
                decode_tables.extend([req.pages] * n)  # read-only below, up to each row's pages
                decode_lens.extend(range(start + 1, end + 1))
            else:
                prefill.append((row, n, end, len(flat), npg))
            slots.extend(slot_range(req.pages, start, end, ps))
            flat.extend(req.pages[:npg])
            row += n
            if batch.samples(i):
                logit_rows.extend(range(row - 1 - len(draft), row))
        padded: list[int] = []  # the decode rows' page tables, padded: [Bd, Pmax] row-major
        pmax = 0
        if decode_rows:
            # pad the page tables to a multiple of 64 tokens: the bf16 matmuls of decode attention
            # (oneDNN) build a kernel per new shape, ~0.6 ms each, so a context length that changes
            # every step would pay that every step; padding (masked) changes the shape every 64 tokens
            pad = max(1, DECODE_PAD_TOKENS // ps)
            pmax = -(-max(-(-n // ps) for n in decode_lens) // pad) * pad
            for t, n in zip(decode_tables, decode_lens):
                npg = -(-n // ps)
                padded.extend(t[:npg])
                padded.extend([0] * (pmax - npg))
        parts = [ids, positions, slots, flat, logit_rows, decode_rows, decode_lens, padded]
        # array('q') then frombuffer: ~30x faster than torch.tensor(list), which inspects every element
        host = torch.frombuffer(array("q", itertools.chain.from_iterable(parts)), dtype=torch.long)
        (input_ids, pos, slot_t, pages, logit_t, drows, dlens, dpages) = host.to(self.device).split(
            [len(p) for p in parts]
        )
        meta = AttentionMetadata(
            page_size=ps,
            slot_mapping=slot_t,
            prefill=[PrefillSeq(q_start=r, q_len=n, kv_len=kv, pages=pages[o : o + k]) for r, n, kv, o, k in prefill],
        )
        if decode_rows:
            meta.decode_rows = drows
            meta.decode_pages = dpages.view(len(decode_rows), pmax)  # padded with page 0
            meta.decode_mask = (torch.arange(pmax * ps, device=self.device)[None, :] < dlens[:, None])[:, None, None, :]
            meta.decode_lens = decode_lens
            meta.decode_lens_t = dlens
            if self.model.attention.reads_shared_pages_once:  # cascade_attention.py
                meta.decode_shared_pages = shared_leading_pages(decode_tables, decode_lens, ps)
        return input_ids, pos, meta, logit_t

    def run(self, batch: ScheduledBatch) -> list[list[int] | None]:
        """The tokens each request emits this step: its next token when it reaches the end of its tokens
        (after a draft, the accepted drafted tokens then the model's next: spec/verify.py), else None."""
        input_ids, positions, meta, rows = self.prepare(batch)
        sampling = [i for i in range(len(batch)) if batch.samples(i)]
        reqs = [batch.requests[i] for i in sampling]
        # a sampled or constrained row reads more than the argmax: a 4-bit head rescores more candidates
        wide = any(not r.params.greedy or r.matcher is not None for r in reqs)
        logits = self.model.forward(input_ids, positions, meta, self.pool.k, self.pool.v, rows, wide)
        specs = [SampleSpec(r.params.temperature, r.params.top_p, r.params.top_k, r.sampling_generator(logits.device))
                 for r in reqs]
        drafts = [batch.draft(i) for i in sampling]
        if self.grammar is not None:  # constrained requests: forbidden tokens to -inf on their rows
            logits = self.grammar.mask_logits(logits, [r.matcher for r in reqs], drafts if batch.drafts else None)
        if not batch.drafts:
            emitted = iter([[t] for t in sample(logits, specs)] if specs else [])
        else:
            greedy = torch.argmax(logits, dim=-1).tolist()  # one host read for every greedy row
            out, row = [], 0
            for draft, spec in zip(drafts, specs):
                k = len(draft) + 1
                out.append(accept(logits[row : row + k], draft, spec, greedy[row : row + k]))
                row += k
            emitted = iter(out)
        return [next(emitted) if batch.samples(i) else None for i in range(len(batch))]
