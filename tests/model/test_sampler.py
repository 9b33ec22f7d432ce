"""The sampler draws from the filtered softmax: frequencies match, filters exclude, seeds repeat,
and noise and generators live on the logits' device."""
from __future__ import annotations

import pytest
import torch

from kvstrata.engine.request import Request
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model import sampler
from kvstrata.model.sampler import SampleSpec, multinomial_sample_one_no_sync, sample, sample_row, sample_tensor


def test_draw_frequencies_match_probabilities() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(torch.stack([multinomial_sample_one_no_sync(probs, gen) for _ in range(n)]), minlength=5)
    freq = counts.float() / n
    assert counts[4] == 0  # a zero-probability token is never drawn
    # 4 standard deviations of a binomial proportion at n = 20000 is < 0.015
    assert torch.allclose(freq[:4], probs[:4], atol=0.015), freq


def test_top_k_top_p_and_greedy() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3)
    gen = torch.Generator().manual_seed(1)
    seen: set[int] = set()
    for _ in range(300):
        greedy, top2, nucleus = sample(logits, [SampleSpec(0.0, 1.0, 0, None), SampleSpec(1.0, 1.0, 2, gen),
                                                SampleSpec(1.0, 0.5, 0, gen)])
        assert greedy == 0 and top2 in (0, 1) and nucleus == 0  # p(token 0) = 0.64 >= top_p alone
        seen.add(top2)
    assert seen == {0, 1}


def test_same_seed_same_draws() -> None:
    probs = torch.softmax(torch.randn(1000), -1)
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(7)
        runs.append([int(multinomial_sample_one_no_sync(probs, gen)) for _ in range(8)])
    assert runs[0] == runs[1] and len(set(runs[0])) > 1  # repeatable, and the generator advances


def test_top_k_top_p_frequencies() -> None:
    """top-k then top-p renormalise over what is left: p = softmax([4, 3, 2]) cut at top_p 0.9
    keeps tokens 0 and 1 (0.665 + 0.245 crosses 0.9) in the ratio e : 1."""
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    gen = torch.Generator().manual_seed(3)
    n = 20000
    draws = torch.stack([sample_row(logits, SampleSpec(1.0, 0.9, 3, gen)) for _ in range(n)])
    freq = torch.bincount(draws, minlength=5).float() / n
    want = torch.tensor([1.0, torch.e ** -1, 0.0, 0.0, 0.0])
    assert torch.allclose(freq, want / want.sum(), atol=0.015), freq


def test_min_p_frequencies() -> None:
    """min-p after temperature: p = softmax([4, 3, 2, 1, 0] / 2); min_p 0.5 keeps p >= p_max / 2, i.e. logits
    within 2 log 2 of the top after scaling: tokens 0 and 1, in the ratio e^0.5 : 1; then top-k 1 keeps one."""
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    gen = torch.Generator().manual_seed(5)
    n = 20000
    draws = torch.stack([sample_row(logits, SampleSpec(2.0, 1.0, 0, gen, min_p=0.5)) for _ in range(n)])
    freq = torch.bincount(draws, minlength=5).float() / n
    want = torch.tensor([torch.e ** 0.5, 1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(freq, want / want.sum(), atol=0.015), freq
    assert {int(sample_row(logits, SampleSpec(2.0, 1.0, 1, gen, min_p=0.5))) for _ in range(50)} == {0}


def test_seeded_rows_repeat_whatever_the_batch() -> None:
    logits = torch.randn(3, 1000)
    spec = lambda seed: SampleSpec(0.8, 0.95, 50, torch.Generator().manual_seed(seed))  # noqa: E731
    alone = [sample(logits[1:2], [spec(5)])[0] for _ in range(2)]
    batched = sample(logits, [SampleSpec(0.0, 1.0, 0, None), spec(5), spec(6)])
    assert alone[0] == alone[1] == batched[1]


def test_noise_is_drawn_on_the_logits_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the meta device (no data, no GPU needed) a CPU noise tensor would not mix with the logits;
    every torch.rand call must name the logits' device."""
    devices: list[torch.device] = []
    real_rand = torch.rand

    def spy(*args: object, **kw: object) -> torch.Tensor:
        devices.append(torch.device(kw["device"]))  # type: ignore[arg-type]
        return real_rand(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler.torch, "rand", spy)
    logits = torch.empty(3, 64, device="meta")
    specs = [SampleSpec(0.0, 1.0, 0, None), SampleSpec(1.0, 1.0, 0, None), SampleSpec(0.7, 0.9, 5, None)]
    out = sample_tensor(logits, specs)
    assert out.device.type == "meta" and out.shape == (3,)
    assert devices == [torch.device("meta")] * 2


def test_seeded_generator_is_made_on_the_given_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seeded request gets its generator on the device the runner names, once (a CUDA device here,
    with torch.Generator faked: none is needed to check the placement)."""
    made: list[torch.device] = []

    class FakeGenerator:
        def __init__(self, device: torch.device) -> None:
            made.append(torch.device(device))
            self.device = torch.device(device)

        def manual_seed(self, seed: int) -> FakeGenerator:
            self.seed = seed
            return self

    monkeypatch.setattr(torch, "Generator", FakeGenerator)
    req = Request("r", [1, 2, 3], SamplingParams(temperature=0.8, seed=42))
    gen = req.sampling_generator(torch.device("cuda", 0))
    assert gen is req.sampling_generator(torch.device("cuda", 0))  # made once, kept across steps
    assert made == [torch.device("cuda", 0)] and gen.seed == 42  # type: ignore[union-attr]
    assert Request("g", [1], SamplingParams(temperature=0.0, seed=42)).sampling_generator(torch.device("cuda")) is None
    assert Request("u", [1], SamplingParams(temperature=0.8)).sampling_generator(torch.device("cuda")) is None


def _reference_probs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """top-p by a full sort over the whole vocabulary, renormalised: the definition."""
    p = logits.softmax(-1)
    sp, order = torch.sort(p, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p
    out = torch.zeros_like(p).scatter(0, order, sp * keep)
    return out / out.sum()


@pytest.mark.parametrize("scale", [4.0, 0.01])  # peaked: the top 1024 hold the nucleus; flat: full sort
def test_top_p_candidates_equal_the_full_sort(scale: float) -> None:
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(0)) * scale
    probs, ids = sampler.filtered_probs(logits, SampleSpec(1.0, 0.9, 0, None))
    assert ids is not None
    if scale > 1:
        assert ids.shape[0] == sampler.TOP_P_CANDIDATES  # the short path was taken
    got = torch.zeros_like(logits).scatter(0, ids, probs)
    assert torch.allclose(got / got.sum(), _reference_probs(logits, 0.9), atol=1e-6)
