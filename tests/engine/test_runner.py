"""ModelRunner.prepare: the one-buffer index tensors equal the per-token definitions."""
from __future__ import annotations

import random

import torch

from kvstrata.engine.request import Request
from kvstrata.engine.runner import DECODE_PAD_TOKENS, ModelRunner, slot_range
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.model.attention import TorchSDPABackend

PS = 16


class _Model:
    device = torch.device("cpu")
    attention = TorchSDPABackend()  # wants the shared-page count, so prepare() computes it too


class _Pool:
    page_size = PS


def _request(rid: str, length: int, computed: int, rng: random.Random) -> Request:
    req = Request(rid, [rng.randrange(3, 1000) for _ in range(length)], SamplingParams(temperature=0.0))
    req.pages = rng.sample(range(1, 4000), -(-length // PS) + 1)  # one spare page past the end
    req.num_computed_tokens = computed
    return req


def test_slot_range_is_per_token_page_lookup() -> None:
    pages = [7, 3, 9, 1]
    for start, end in [(0, 1), (5, 16), (15, 17), (16, 64), (3, 61), (40, 41)]:
        want = [pages[p // PS] * PS + p % PS for p in range(start, end)]
        assert list(slot_range(pages, start, end, PS)) == want


def test_prepare_matches_the_per_token_definitions() -> None:
    rng = random.Random(0)
    # decode rows, a middle prefill chunk (no sample), a last chunk (samples), a first chunk
    reqs = [_request("d0", 300, 299, rng), _request("p0", 900, 512, rng), _request("d1", 47, 46, rng),
            _request("p1", 70, 30, rng), _request("p2", 200, 0, rng)]
    n = [1, 256, 1, 40, 100]
    batch = ScheduledBatch(reqs, n)
    ids, pos, meta, rows = ModelRunner(_Model(), _Pool()).prepare(batch)  # type: ignore[arg-type]
    want_ids, want_pos, want_slots, want_rows, row = [], [], [], [], 0
    for i, (r, k) in enumerate(zip(reqs, n)):
        span = range(r.num_computed_tokens, r.num_computed_tokens + k)
        want_ids += [r.token_ids[p] for p in span]
        want_pos += list(span)
        want_slots += [r.pages[p // PS] * PS + p % PS for p in span]
        row += k
        if batch.samples(i):
            want_rows.append(row - 1)
    assert ids.tolist() == want_ids and pos.tolist() == want_pos and rows.tolist() == want_rows
    assert meta.slot_mapping.tolist() == want_slots
    assert [(s.q_start, s.q_len, s.kv_len) for s in meta.prefill] == [(1, 256, 768), (258, 40, 70), (298, 100, 100)]
    assert meta.prefill[0].pages.tolist() == reqs[1].pages[:48]
    assert meta.prefill[2].pages.tolist() == reqs[4].pages[:7]
    assert meta.decode_rows is not None and meta.decode_rows.tolist() == [0, 257]
    assert meta.decode_pages is not None and meta.decode_mask is not None
    pmax = -(-19 // (DECODE_PAD_TOKENS // PS)) * (DECODE_PAD_TOKENS // PS)  # 300 tokens: 19 pages, padded
    assert meta.decode_pages.tolist() == [reqs[0].pages[:19] + [0] * (pmax - 19), reqs[2].pages[:3] + [0] * (pmax - 3)]
    assert meta.decode_mask.shape == (2, 1, 1, pmax * PS)
    assert meta.decode_mask[:, 0, 0].sum(-1).tolist() == [300, 47] and meta.decode_lens == [300, 47]
    assert meta.decode_lens_t is not None and meta.decode_lens_t.tolist() == [300, 47]
