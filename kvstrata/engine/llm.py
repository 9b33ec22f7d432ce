"""LLM: the offline API on the same engine (`from kvstrata import LLM, SamplingParams`)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.engine import Engine
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.logprobs import TokenLogprob


@dataclass
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    cached_tokens: int
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per token, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token, when params.prompt_logprobs is set


def _pick(cls: type, kwargs: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})


class LLM:
    """LLM(model="smollm2", dtype="float32", max_total_tokens=4096, ...): any config field."""

    def __init__(self, model: str = "smollm2", **kwargs: Any) -> None:
        kwargs["model"] = model
        model_cfg = _pick(ModelConfig, kwargs)
        cache_cfg = _pick(CacheConfig, kwargs)
        sched_cfg = _pick(SchedulerConfig, kwargs)
        if kwargs:
            raise TypeError(f"unknown LLM options: {sorted(kwargs)}")
        self.engine = Engine(model_cfg, cache_cfg, sched_cfg)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: Sequence[str | list[int]] | str,
        params: SamplingParams | None = None,
    ) -> list[Completion]:
        """Run all prompts as one continuous batch; results in prompt order."""
        params = params or SamplingParams()
        if isinstance(prompts, str):
            prompts = [prompts]
        order: list[str] = []
        prompt_ids: dict[str, list[int]] = {}
        for p in prompts:
            ids = self.tokenizer.encode(p) if isinstance(p, str) else list(p)
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, ids, params)
            order.append(rid)
            prompt_ids[rid] = ids
        acc: dict[str, Completion] = {
            rid: Completion(prompt_ids[rid], [], "", None, 0) for rid in order
        }
        while self.engine.has_unfinished():
            for out in self.engine.step():
                c = acc[out.request_id]
                c.token_ids.extend(out.new_token_ids)
                c.text += out.new_text
                c.logprobs.extend(out.new_logprobs or ())
                if out.prompt_logprobs is not None:
                    c.prompt_logprobs = out.prompt_logprobs
                if out.finished:
                    c.finish_reason = out.finish_reason
                    c.cached_tokens = out.cached_tokens
        return [acc[rid] for rid in order]

    def chat(self, messages: list[dict[str, Any]], params: SamplingParams | None = None) -> Completion:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.generate([self.tokenizer.encode(text)], params)[0]
