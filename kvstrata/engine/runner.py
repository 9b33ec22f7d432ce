"""ModelRunner: turn a ScheduledBatch into tensors, run the model, sample next tokens."""
from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass, field

import torch

from kvstrata.engine.grammar import GrammarBackend
from kvstrata.engine.request import Request
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.engine.spec.verify import accept
from kvstrata.kv.pool import PagePool
from kvstrata.model.attention import AttentionMetadata, PrefillSeq
from kvstrata.model.cascade_attention import shared_leading_pages
from kvstrata.model.llama import LlamaModel
from kvstrata.model.logprobs import TokenLogprob, token_logprobs
from kvstrata.model.penalties import PenaltyRow, apply_penalties
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


@dataclass
class StepResult:
    """What one step produced: per request (batch index) the tokens it emits (None: mid-prompt; see
    ModelRunner.run), their logprobs where asked for, and prompt logprobs as (first position, entries)."""

    tokens: list[list[int] | None]
    logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    prompt_logprobs: dict[int, tuple[int, list[TokenLogprob]]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: PagePool) -> None:
        self.model = model
        self.pool = pool
        self.device = model.device
        self.page_size = pool.page_size
        self.grammar: GrammarBackend | None = None  # set by the engine
        # set by prepare(), read by run(): (batch index, first position, rows) of each request whose prompt
        # rows' logits come first in the step's logits (prompt logprobs), before the sampled rows
        self.prompt_rows: list[tuple[int, int, int]] = []

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
        prompt_logit_rows: list[int] = []
        self.prompt_rows = []
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
            if req.params.prompt_logprobs is not None and start < req.num_prompt_tokens - 1:
                rows = min(end, req.num_prompt_tokens - 1) - start  # row of position p: logits of token p + 1
                prompt_logit_rows.extend(range(row, row + rows))
                self.prompt_rows.append((i, start, rows))
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
        parts = [ids, positions, slots, flat, prompt_logit_rows + logit_rows, decode_rows, decode_lens, padded]
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

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        """The tokens each request emits this step: its next token when it reaches the end of its tokens
        (after a draft, the accepted drafted tokens then the model's next: spec/verify.py), else None.
        Each sampled row's logits get the grammar mask, then the request's bias and penalties
        (model/penalties.py), then the sampler; logprobs are read before all of that (model/logprobs.py)."""
        input_ids, positions, meta, rows = self.prepare(batch)
        prompt_rows = self.prompt_rows
        n_prompt = sum(count for _, _, count in prompt_rows)
        sampling = [i for i in range(len(batch)) if batch.samples(i)]
        reqs = [batch.requests[i] for i in sampling]
        # a sampled, constrained or scored row reads more than the argmax: a 4-bit head rescores more candidates
        wide = n_prompt > 0 or any(not r.params.greedy or r.matcher is not None or r.params.logprobs is not None
                                   for r in reqs)
        logits = self.model.forward(input_ids, positions, meta, self.pool.k, self.pool.v, rows, wide)
        result = StepResult([])
        if n_prompt:
            result.prompt_logprobs = self._prompt_logprobs(batch, logits[:n_prompt], prompt_rows)
            logits = logits[n_prompt:]
        specs = [SampleSpec(r.params.temperature, r.params.top_p, r.params.top_k, r.sampling_generator(logits.device),
                            r.params.min_p) for r in reqs]
        drafts = [batch.draft(i) for i in sampling]
        offsets = list(itertools.accumulate((len(d) + 1 for d in drafts), initial=0))
        scored = [j for j, r in enumerate(reqs) if r.params.logprobs is not None]
        # logprobs read the logits as the model gave them: a copy only when a mask or penalty will change them
        changed = any(reqs[j].matcher is not None or reqs[j].params.penalized for j in scored)
        raw = (logits.clone() if changed else logits) if scored else None
        if self.grammar is not None:  # constrained requests: forbidden tokens to -inf on their rows
            logits = self.grammar.mask_logits(logits, [r.matcher for r in reqs], drafts if batch.drafts else None)
        apply_penalties(logits, self._penalty_rows(reqs, drafts, offsets, logits))
        if not batch.drafts:
            emitted = [[t] for t in sample(logits, specs)] if specs else []
        else:
            greedy = torch.argmax(logits, dim=-1).tolist()  # one host read for every greedy row
            emitted = [accept(logits[offsets[j] : offsets[j + 1]], draft, spec, greedy[offsets[j] : offsets[j + 1]])
                       for j, (draft, spec) in enumerate(zip(drafts, specs))]
        if raw is not None:
            result.logprobs = self._output_logprobs(raw, [sampling[j] for j in scored], [reqs[j] for j in scored],
                                                    [offsets[j] for j in scored], [emitted[j] for j in scored])
        it = iter(emitted)
        result.tokens = [next(it) if batch.samples(i) else None for i in range(len(batch))]
        return result

    @staticmethod
    def _penalty_rows(reqs: list[Request], drafts: list[list[int]], offsets: list[int], logits: torch.Tensor) -> list[PenaltyRow]:
        """A PenaltyRow for each sampled row of a penalized request: a verify step's row d has the output so
        far and the first d drafted tokens behind it, as if decoded one by one."""
        out: list[PenaltyRow] = []
        for j, (r, draft) in enumerate(zip(reqs, drafts)):
            p = r.params
            if not p.penalized:
                continue
            history = r.token_ids[r.num_prompt_tokens :]
            mask = r.prompt_mask(logits.shape[1], logits.device) if p.repetition_penalty != 1.0 else None
            out.extend(PenaltyRow(offsets[j] + d, history + draft[:d], mask, p.presence_penalty, p.frequency_penalty,
                                  p.repetition_penalty, p.logit_bias) for d in range(len(draft) + 1))
        return out

    @staticmethod
    def _output_logprobs(raw: torch.Tensor, where: list[int], reqs: list[Request], offsets: list[int],
                         emitted: list[list[int]]) -> dict[int, list[TokenLogprob]]:
        """Logprobs of each scored request's emitted tokens, from `raw` (the step's logits before any change).
        A request's rows start at its offset; a verify step's first len(emitted) rows emitted a token, and
        only those are scored."""
        sel, toks, top = [], [], []
        for r, at, em in zip(reqs, offsets, emitted):
            sel.extend(range(at, at + len(em)))
            toks.extend(em)
            top.extend([r.params.logprobs] * len(em))
        rows = raw if sel == list(range(raw.shape[0])) else raw.index_select(
            0, torch.tensor(sel, dtype=torch.long, device=raw.device))
        entries = token_logprobs(rows, toks, top)
        out, at = {}, 0
        for i, em in zip(where, emitted):
            out[i], at = entries[at : at + len(em)], at + len(em)
        return out

    @staticmethod
    def _prompt_logprobs(batch: ScheduledBatch, logits: torch.Tensor, prompt_rows: list[tuple[int, int, int]]
                         ) -> dict[int, tuple[int, list[TokenLogprob]]]:
        """Each prompt row's logprob of the prompt token after it: (first position scored, entries)."""
        toks, top = [], []
        for i, start, count in prompt_rows:
            req = batch.requests[i]
            toks.extend(req.token_ids[start + 1 : start + 1 + count])
            top.extend([req.params.prompt_logprobs or 0] * count)
        entries = token_logprobs(logits, toks, top)
        out, at = {}, 0
        for i, start, count in prompt_rows:
            out[i], at = (start + 1, entries[at : at + count]), at + count
        return out
