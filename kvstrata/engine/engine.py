"""Engine: the step loop (schedule -> run -> postprocess) over one model and one KV pool."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_flags import ConfigError, check_config
from kvstrata.engine.grammar import GrammarBackend, advance
from kvstrata.engine.grammar_cache import GrammarCache
from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.output_processor import OutputProcessor
from kvstrata.engine.outputs import EngineOverloadedError, RequestOutput
from kvstrata.engine.request import Request
from kvstrata.engine.runner import ModelRunner, StepResult
from kvstrata.engine.sampling_params import InvalidRequestError, SamplingParams
from kvstrata.engine.scheduler import ScheduledBatch, Scheduler
from kvstrata.engine.spec.cost import measure_step_cost
from kvstrata.engine.spec.speculator import Speculator
from kvstrata.engine.malloc_tuning import keep_freed_heap
from kvstrata.engine.model_loader import kv_layout, load_model
from kvstrata.engine.next_turn import is_follow_up, queue_follow_up
from kvstrata.engine.warmup import WarmupReport, warm_up
from kvstrata.kv.events import attach_kv_events
from kvstrata.kv.hashing import namespace_root
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import RadixPrefixCache
from kvstrata.kv.tiers_factory import build_tiers
from kvstrata.model.arch import ModelArch

log = logging.getLogger(__name__)

SPEC_COST_ROWS = 8  # rows of the steps that time what a row costs (spec/cost.py)
WARMUP_MACS = 1 << 38  # the default warm-up step's linear work (Engine.default_warmup_tokens)
# ... and its tokens where prefill runs on the integer kernels: they build nothing per shape, so a short step
# warms them as well as a long one, in a fraction of the start (docs/production.md)
WARMUP_INT_TOKENS = 16


@dataclass(frozen=True)
class EngineInfo:
    arch: ModelArch
    model_identity: str
    served_model_name: str
    max_model_len: int
    dtype: str
    num_pages: int
    page_size: int


class Engine:
    def __init__(self, model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig) -> None:
        t0 = time.monotonic()
        for cfg in (model_cfg, cache_cfg, sched_cfg):
            check_config(cfg)
        if model_cfg.num_threads:
            torch.set_num_threads(model_cfg.num_threads)
        if model_cfg.malloc_tuning == "auto" and model_cfg.device.startswith("cpu"):
            log.info("malloc: %s", keep_freed_heap())
        loaded = load_model(model_cfg)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        path, arch, identity, dtype = loaded.path, self.model.arch, loaded.identity, loaded.dtype

        ps = cache_cfg.page_size
        per_page = PagePool.bytes_per_page(ps, arch.num_layers, arch.num_kv_heads, arch.head_dim, dtype)
        if cache_cfg.max_total_tokens:
            num_pages = -(-cache_cfg.max_total_tokens // ps)
        else:
            num_pages = max(1, int(cache_cfg.kv_cache_memory * 1e9) // per_page)
        self.pool = PagePool(num_pages, ps, arch.num_layers, arch.num_kv_heads, arch.head_dim, dtype, loaded.device)
        root = namespace_root(path.name + ":" + identity, loaded.dtype_name, ps, kv_layout(loaded))
        policy = cache_cfg.eviction_policy
        cache = RadixPrefixCache(self.pool, ps, root, policy) if cache_cfg.enable_prefix_caching else None
        self.prefix_cache = cache
        # KV events in vLLM's wire format, for the DP gateway and outside routers (None when off)
        self.kv_events = attach_kv_events(cache, cache_cfg)
        # KV tiers beyond L1: host-memory L2, L3 store, prefetch (kvstrata/kv/tiers.py; None when off)
        self.tiers = build_tiers(cache_cfg, cache)
        self.scheduler = Scheduler(sched_cfg, KVCacheManager(self.pool, cache, self.tiers))
        self.runner = ModelRunner(self.model, self.pool)
        self.grammar = self.runner.grammar = GrammarBackend(self.tokenizer, arch.vocab_size)
        self.grammars = GrammarCache(self.grammar)  # compiled grammars, copied per request

        limit = min(arch.max_position, num_pages * ps)
        if model_cfg.max_model_len:
            limit = min(limit, model_cfg.max_model_len)
        eos = tuple(self.tokenizer.eos_token_ids) or tuple(arch.eos_token_ids)
        self.outputs = OutputProcessor(self.tokenizer, eos, limit)
        self.sched_cfg = sched_cfg
        self.model_cfg = model_cfg
        self.info = EngineInfo(
            arch=arch,
            model_identity=identity,
            served_model_name=model_cfg.served_model_name or _default_name(model_cfg.model),
            max_model_len=limit,
            dtype=loaded.dtype_name,
            num_pages=num_pages,
            page_size=ps,
        )
        self._requests: dict[str, Request] = {}
        self.spec = (None if sched_cfg.speculative == "off" else  # speculative decoding (engine/spec/)
                     Speculator(sched_cfg.speculative, sched_cfg.num_speculative_tokens, sched_cfg.spec_max_step_rows, limit,
                                end_ids=eos))
        if self.spec is not None:  # a lone request's widest verify step stays on its one-row steps' kernels
            self.model.decode_max_rows = max(self.model.decode_max_rows, 1 + sched_cfg.num_speculative_tokens)
        root = self.prefix_cache.root.hex()[:16] if self.prefix_cache is not None else "-"
        log.info(  # kv_namespace: servers share L2/L3 pages only when theirs match (model, dtype, page size, layout)
            "engine ready model=%s dtype=%s pages=%d page_size=%d max_model_len=%d threads=%d kv_namespace=%s "
            "load_s=%.1f", path.name, loaded.dtype_name, num_pages, ps, limit, torch.get_num_threads(), root,
            time.monotonic() - t0,
        )

    # -- requests --------------------------------------------------------------------------
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> SamplingParams:
        """Validate a request; returns params with max_tokens clamped to the context left."""
        vocab = self.info.arch.vocab_size
        params.validate(vocab, self.sched_cfg.max_n, self.sched_cfg.max_stop_strings)
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not (0 <= t < vocab)]
        if bad:
            raise InvalidRequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "prompt")
        limit = self.info.max_model_len
        if len(prompt_token_ids) >= limit:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens but this model's context is {limit} tokens "
                f"(prompt plus at least one generated token must fit)",
                "prompt",
                "context_length_exceeded",
            )
        room = limit - len(prompt_token_ids)
        if params.max_tokens > room:
            params = replace(params, max_tokens=room)
        return params

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, matcher: Any = None
    ) -> None:
        """`matcher`: the grammar's, compiled off this thread (AsyncEngine); compiled here if None."""
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", "request_id")
        params = self.check_request(prompt_token_ids, params)
        if not self.scheduler.can_add():
            limit = self.sched_cfg.max_queue_requests
            raise EngineOverloadedError(f"{limit} requests are already waiting (--max-queue-requests {limit})")
        req = Request(request_id, list(prompt_token_ids), params)
        if params.grammar is not None:
            req.matcher = matcher if matcher is not None else self.grammars.matcher(params.grammar)
        self._requests[request_id] = req
        self.outputs.add(req)
        self.scheduler.add(req)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req, "abort")
        if self.spec is not None:
            self.spec.finish(req, keep_output=False)
        return self.outputs.output(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            self.scheduler.kv.wait_for_io(0.01)  # waiting only on L3 prefetches: sleep, not spin
            return []
        if self.spec is not None:
            if not self.spec.measured:
                self.measure_spec_cost()
            self.spec.draft(batch, self.scheduler.kv, self.sched_cfg.max_num_batched_tokens - sum(batch.num_tokens))
        shape = batch.shape() if self.scheduler.slo is not None else None  # only the slo policy reads step times
        t = time.perf_counter()
        try:
            step = self.runner.run(batch)
        except Exception as exc:  # one bad batch fails its requests, not the engine
            log.exception("model step failed; failing %d requests", len(batch))
            return self._fail(batch, f"{type(exc).__name__}: {exc}")
        if shape is not None:
            self.scheduler.timer.observe(shape, time.perf_counter() - t)  # what steps cost here (step_timer.py)
        return self.postprocess(batch, step)

    def postprocess(self, batch: ScheduledBatch, step: StepResult) -> list[RequestOutput]:
        """Append each request's emitted tokens (stopping at the first that ends it) and their logprobs,
        keep prompt logprobs, mark the tokens whose K/V the step wrote computed (its last token and the
        accepted drafts, not the rejected ones), finish what ended; returns each request's output delta."""
        now = time.monotonic()
        outs: list[RequestOutput] = []
        for i, (first, entries) in step.prompt_logprobs.items():
            req = batch.requests[i]
            if len(req.prompt_logprobs) != req.num_prompt_tokens:  # made at the first chunk; a recompute overwrites
                req.prompt_logprobs = [None] * req.num_prompt_tokens
            req.prompt_logprobs[first : first + len(entries)] = entries
        for i, (req, n) in enumerate(zip(batch.requests, batch.num_tokens)):
            toks, draft = step.tokens[i], batch.draft(i)
            if toks is None or req.finished:
                self.scheduler.advance(req, n - len(draft))
                continue
            reason = None
            emitted = 0
            for tok in toks:
                req.token_ids.append(tok)
                emitted += 1
                reason = self.outputs.append_token(req, tok)
                if req.matcher is not None and advance(req.matcher, tok) and reason is None:
                    reason = "stop"  # the grammar is complete
                if reason is not None:
                    break
            if i in step.logprobs:
                req.logprobs.extend(step.logprobs[i][:emitted])
            accepted = len(toks) - 1  # drafted tokens the model agreed with: their K/V is good
            self.scheduler.advance(req, n - len(draft) + min(emitted, accepted))
            if draft and reason is None:
                self.scheduler.kv.trim(req)
            req.stats.output_tokens = req.num_output_tokens
            if req.stats.first_token is None:
                req.stats.first_token = now
            if self.spec is not None:
                self.spec.emitted(req, req.token_ids[-emitted:], len(draft), accepted)
            if reason is not None:
                self.scheduler.finish(req, reason)
                self._requests.pop(req.request_id, None)
                if self.spec is not None:
                    self.spec.finish(req, keep_output=True)
                queue_follow_up(self, req, self.info.max_model_len)
            out = self.outputs.output(req)
            if not is_follow_up(req.request_id):  # a follow-up is the cache's work: nobody reads its output
                outs.append(out)
        return outs

    def _fail(self, batch: ScheduledBatch, error: str) -> list[RequestOutput]:
        outs = []
        for req in batch.requests:
            req.error = error
            self.scheduler.finish(req, "error")
            if self.spec is not None:
                self.spec.finish(req, keep_output=False)
            self._requests.pop(req.request_id, None)
            out = self.outputs.output(req)
            if not is_follow_up(req.request_id):
                outs.append(out)
        return outs

    def default_warmup_tokens(self, step_budget: int) -> int:
        """The step budget, cut so a warm-up prefill does at most WARMUP_MACS multiply-adds in the linears
        (SmolLM2 keeps 2048 tokens; a 1B model runs ~280, not the minute a 2k-token step takes on 2 cores),
        and to WARMUP_INT_TOKENS where prefill runs on the integer kernels."""
        if self.model.int_prefill:
            return min(step_budget, WARMUP_INT_TOKENS)
        return min(step_budget, max(64, WARMUP_MACS // max(1, self.model.linear_params())))

    def warm_up(self, num_tokens: int) -> WarmupReport:
        """Before any request: one dummy step of `num_tokens` (and a decode step); warmup.py says why.
        Also builds the grammar tokenizer, which would otherwise hold the GIL at the first constrained request."""
        self.grammar.prepare()
        self.measure_spec_cost()
        return warm_up(self.runner, num_tokens, self.info.max_model_len, self.info.arch.vocab_size,
                       self.sched_cfg.max_num_seqs)

    def measure_spec_cost(self) -> None:
        """Time what a step's rows cost here (spec/cost.py): drafts join a step only while they pay for
        it. Done by the warm-up, else before the first step that could draft."""
        if self.spec is not None:
            rows = min(SPEC_COST_ROWS, self.sched_cfg.spec_max_step_rows)
            c = self.spec.cost = measure_step_cost(self.runner, rows, self.info.max_model_len, self.info.arch.vocab_size)
            self.spec.measured = True
            log.info("speculative decoding: %s, up to %d drafted tokens a request; a step here costs %.1f ms + %.2f ms a "
                     "row + %.2f ms a request per 1k tokens of its context (+ %.2f for each further row)", self.spec.mode,
                     self.sched_cfg.num_speculative_tokens, c.base * 1e3, c.per_row * 1e3, c.per_token * 1e6,
                     c.per_token_extra * 1e6)

    def flush_cache(self) -> int:
        return self.scheduler.kv.reset_cache()

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    def close(self, drain_timeout_s: float = 5.0, flush: bool = True) -> None:
        """Release what outlives the step loop (call it once the loop has stopped): L1 and L2 pages the
        L3 store lacks are flushed to it (`flush`) and in-flight writes drained, within `drain_timeout_s`."""
        if self.tiers is not None:
            self.tiers.close(drain_timeout_s, flush=flush)


def _default_name(model: str) -> str:
    p = Path(model)
    return p.stem if p.suffix == ".gguf" else (p.name or model)
