"""The start-up warm-up (tiny random-weight model): it leaves the pool, the prefix cache and later
outputs as they would be without it, keeps to the pages and context there are, and runs on the engine
thread."""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.engine import Engine
from kvstrata.engine.outputs import EngineDeadError
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.engine.warmup import DECODE_ROWS

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j) % 40000 + 5 for j in range(n)] for i, n in enumerate([40, 200, 333])]


def engine(tiny_model_dir: Path, tokens: int = 4096, **sched: int) -> Engine:
    return Engine(ModelConfig(model=str(tiny_model_dir), dtype="float32"), CacheConfig(max_total_tokens=tokens),
                  SchedulerConfig(**sched))


def generate(eng: Engine, prompts: list[list[int]]) -> list[list[int]]:
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, GREEDY)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
    return [out[f"r{i}"] for i in range(len(prompts))]


def test_warm_up_leaves_pool_cache_and_outputs_as_without_it(tiny_model_dir: Path) -> None:
    warm, cold = engine(tiny_model_dir), engine(tiny_model_dir)
    report = warm.warm_up(1000)
    assert (report.prefill_tokens, report.decode_rows) == (1000, DECODE_ROWS) and report.seconds > 0
    pool = warm.pool
    assert pool.num_free == pool.num_pages and pool.num_in_use == 0
    assert all(int(t.count_nonzero()) == 0 for t in pool.k + pool.v)  # no dummy K/V left in any page
    assert warm.prefix_cache is not None and warm.prefix_cache.num_cached_pages == 0
    assert generate(warm, PROMPTS) == generate(cold, PROMPTS)
    warm.check_integrity()


def test_warm_up_keeps_to_the_free_pages_and_the_context(tiny_model_dir: Path) -> None:
    small = engine(tiny_model_dir, tokens=256, max_num_seqs=2)
    report = small.warm_up(100_000)
    assert report.prefill_tokens == 255 and report.decode_rows == 2  # 16 pages of 16 hold 255 + the decode token
    assert small.pool.num_free == small.pool.num_pages
    assert small.warm_up(1).prefill_tokens == 0  # too small to be a prefill: nothing runs
    assert generate(small, PROMPTS[:1])[0]


def test_the_default_warm_up_is_cut_for_large_models(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstrata.engine import engine as engine_module

    eng = engine(tiny_model_dir)
    params = eng.model.linear_params()
    a = eng.model.arch
    per_layer = (a.num_heads + 2 * a.num_kv_heads) * a.head_dim * a.hidden_size + a.num_heads * a.head_dim * a.hidden_size
    assert params == a.num_layers * (per_layer + 3 * a.intermediate_size * a.hidden_size)
    assert eng.default_warmup_tokens(2048) == 2048  # a small model: the whole step budget
    monkeypatch.setattr(engine_module, "WARMUP_MACS", params * 300)
    assert eng.default_warmup_tokens(2048) == 300
    monkeypatch.setattr(engine_module, "WARMUP_MACS", params)
    assert eng.default_warmup_tokens(2048) == 64  # never below a 64-token step
    monkeypatch.setattr(engine_module, "WARMUP_MACS", params * 300)
    monkeypatch.setattr(eng.model, "int_prefill", True)  # prefill on the integer kernels: nothing to build per shape
    assert eng.default_warmup_tokens(2048) == engine_module.WARMUP_INT_TOKENS
    assert eng.default_warmup_tokens(16) == 16


def test_call_blocking_runs_on_the_engine_thread(tiny_model_dir: Path) -> None:
    import threading

    aeng = AsyncEngine(engine(tiny_model_dir))
    try:
        assert aeng.call_blocking(lambda e: threading.current_thread().name) == "kvstrata-engine"
        assert aeng.call_blocking(lambda e: e.warm_up(64)).prefill_tokens == 64
        with pytest.raises(ZeroDivisionError):
            aeng.call_blocking(lambda e: 1 // 0)
    finally:
        aeng.shutdown()
    with pytest.raises(EngineDeadError):
        aeng.call_blocking(lambda e: 1)
