"""The response cache's key: a canonical hash of everything that can change a request's output.

`request_key(route, req, namespace, tenant)` hashes the route, the namespace (served model name, weights
identity and chat template, from `engine_namespace`), the API key's tenant (serving/auth.py: tenants
never share a result) and the validated request body with only
the fields that never change the output left out (`IGNORED_FIELDS`). Every other field is in the
key, so a field added to protocol.py later is keyed by default: the safe direction. Extra
fields pydantic ignores (`"cache": false`, vendor extras) never reach the engine either.

Canonical: spellings the engine treats alike hash alike: `stop: "x"` == `["x"]`, the neutral
sampling values (temperature 1, top_p 1, top_k 0 or -1, penalties 0) == absent, 0 == 0.0 ==
any temperature below GREEDY_BELOW,
chat's `max_completion_tokens` wins over `max_tokens` and a completion without max_tokens gets 16,
as in protocol.py, messages as the chat template sees them ('developer' renders as 'system').
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from kvstrata.config import GREEDY_BELOW
from kvstrata.serving.protocol import COMPLETIONS_DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine

CHAT = "chat"
COMPLETIONS = "completions"
# transport, routing and cache hints only: same tokens whatever they say
IGNORED_FIELDS = frozenset({
    "user", "stream", "stream_options", "timeout", "prompt_cache_key", "prompt_cache_retention", "data_parallel_rank",
    "priority",
})
# values that mean "off": dropped, so sending them equals leaving them out
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "temperature": (1.0,),
    "top_p": (1.0,),
    "top_k": (0, -1),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "min_p": (0.0,),
    "repetition_penalty": (1.0,),
    "logit_bias": ({},),
    "stop": ([],),
    "stop_token_ids": ([],),
    "response_format": ({"type": "text"},),
}
_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty")


def canonical_body(req: BaseModel) -> dict[str, Any]:
    """The request fields that can change its output, in one spelling per meaning."""
    body = req.model_dump(exclude=set(IGNORED_FIELDS), exclude_none=True, exclude_defaults=True)
    body.pop("model", None)  # None or the served model (anything else is a 404); the namespace names it
    for name in _FLOATS:
        if name in body:
            body[name] = float(body[name])
    if 0.0 < body.get("temperature", 1.0) < GREEDY_BELOW:  # argmax as 0 is (negatives stay: a 400)
        body["temperature"] = 0.0
    if isinstance(body.get("stop"), str):
        body["stop"] = [body["stop"]]
    if "messages" in body:
        body["messages"] = [m.for_template() for m in getattr(req, "messages")]
        wanted = body.pop("max_completion_tokens", None)
        if wanted is not None:
            body["max_tokens"] = wanted
    elif "max_tokens" not in body:
        body["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] in neutral:
            del body[name]
    return body


def request_key(route: str, req: BaseModel, namespace: str, tenant: str | None = None) -> str:
    """sha256 hex of (route, namespace, canonical body, tenant): tenants never share a result."""
    canonical = [route, namespace, canonical_body(req), tenant]
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def is_deterministic(req: BaseModel) -> bool:
    """Greedy (temperature 0, or below GREEDY_BELOW) or a fixed seed: one possible output, so the
    key is full at one result."""
    temperature = getattr(req, "temperature", None)
    return (temperature is not None and temperature < GREEDY_BELOW) or getattr(req, "seed", None) is not None


def engine_namespace(engine: AsyncEngine) -> str:
    """Served model name, weights identity and chat template: keys of another model never match."""
    template = engine.tokenizer.chat_template
    template_id = hashlib.sha256(template.source.encode()).hexdigest()[:16] if template is not None else "none"
    return f"{engine.served_model_name}|{engine.engine.info.model_identity}|{template_id}"


def load_fixed_keys(path: str) -> list[tuple[str, BaseModel]]:
    """(route, request) of each line of a JSON-lines file of request bodies, as a client sends them.

    A body with "messages" is a chat request, one with "prompt" a completion; blank lines are
    skipped. Raises ValueError naming the file and line of anything else.
    """
    out: list[tuple[str, BaseModel]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"--response-cache-fixed-keys {path}, line {number}"
            try:
                body = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc}); write one request body per line") from exc
            if not isinstance(body, dict) or not ({"messages", "prompt"} & set(body)):
                raise ValueError(f"{where}: not a request body; give a JSON object with 'messages' or 'prompt'")
            model: type[BaseModel] = ChatCompletionRequest if "messages" in body else CompletionRequest
            try:
                out.append((CHAT if "messages" in body else COMPLETIONS, model.model_validate_json(line)))
            except ValidationError as exc:
                raise ValueError(f"{where}: invalid request body: {exc.errors()[0].get('msg')}") from exc
    return out
