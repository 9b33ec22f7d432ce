"""Frozen configuration dataclasses of the HTTP processes: a rank's server (`ServerConfig`) and the
data-parallel gateway in front of the ranks (`RouterConfig`); the CLI is generated from their fields.

The engine's own configs (model, KV cache, scheduler) and the `opt` field helper are in
kvstrata/config.py; kvstrata/config_flags.py turns the fields of both into `--flag-name` options.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvstrata.config import opt


@dataclass(frozen=True)
class ServerConfig:
    host: str = opt("127.0.0.1", "address to listen on")
    port: int = opt(8000, "port to listen on", min=0, max=65535)
    enable_log_request_stats: bool = opt(False, "log one key=value line per finished request")
    log_level: str = opt("info", "log level", choices=["debug", "info", "warning", "error"])
    # Response cache (kvstrata/serving/response_cache/); EnergonAI's flag spellings as aliases.
    response_cache_size: int = opt(
        0, "most request keys the response cache holds, LRU (0 = off)", aliases=["--cache_size"]
    )
    response_cache_list_size: int = opt(
        1, "results kept per sampled key; it hits once full, with one picked at random", aliases=["--cache_list_size"]
    )
    response_cache_fixed_keys: str | None = opt(
        None, "JSON-lines file of request bodies whose keys are never evicted nor counted in the size"
    )
    dp_size: int = opt(
        1, "data-parallel engine ranks: N > 1 starts N rank processes and the gateway (kvstrata/router) on --port"
    )
    rank_ports: str = opt(
        "", "with --dp-size N: the N loopback ports of the ranks, comma-separated (default: free ports, logged)"
    )
    tool_call_parser: str = opt(
        "auto", "how tool calls are read out of replies (vLLM's names); auto = from the chat template: "
        "hermes for <tool_call> templates, llama3_json for Llama 3, json for templates with no tool syntax",
        choices=["auto", "hermes", "llama3_json", "json"],
    )
    reasoning_parser: str = opt(
        "auto", "how reasoning is split out of replies (`reasoning_content`, Responses `reasoning` items; vLLM's "
        "names); auto = from the chat template: none without <think>, deepseek_r1 when its generation prompt "
        "opens <think>, else qwen3",
        choices=["auto", "qwen3", "deepseek_r1", "none"],
    )
    # `kvstrata analyze FILE` reads this log (kvstrata/serving/request_log.py says what redaction keeps)
    log_requests: str | None = opt(None, "append every request body to this JSON-lines file (for `kvstrata analyze`)")
    log_requests_redact: bool = opt(
        False, "with --log-requests: replace each word/number of message text and tools by a same-length hash placeholder"
    )
    # Production hardening (kvstrata/serving/auth.py, limits.py, shutdown.py)
    api_key: tuple[str, ...] = opt(
        (), "API key clients send as `Authorization: Bearer KEY` (repeatable; also $KVSTRATA_API_KEY)",
        repeatable=True,
    )
    api_key_file: str | None = opt(None, "file of `KEY TENANT` lines: each key's tenant gets its own caches")
    metrics_public: bool = opt(False, "serve /metrics, /dashboard and the admin routes without an API key")
    max_request_body_bytes: int = opt(8 * 1024 * 1024, "largest request body accepted (413 beyond)", min=1)
    max_json_depth: int = opt(32, "deepest JSON nesting accepted in a request body (400 beyond)", min=2)
    request_body_timeout: float = opt(
        5.0, "seconds to wait for the next piece of a request body before answering 408", min=0.01
    )
    shutdown_timeout: float = opt(30.0, "on SIGTERM, seconds to let running requests finish", min=0)
    warmup_tokens: int | None = opt(
        None,
        "dummy prompt tokens the engine runs in one step (plus one decode step) before the server says it is "
        "ready, so the first request pays no first-use costs (page faults, kernels at that size), as vLLM's "
        "start-up profile run; default = --max-num-batched-tokens, cut for large models to ~2.7e11 multiply-adds "
        "(SmolLM2: 2048 tokens, a 1B model: ~280) and to 16 where prefill runs on the integer kernels, 0 = off",
        min=0,
    )


@dataclass(frozen=True)
class RouterConfig:
    """The gateway in front of data-parallel ranks (`serve --dp-size N`, `kvstrata route`)."""

    policy: str = opt(
        "cost", "how the gateway picks a rank: cache_aware (SGLang's: longest cached match, unless loads are "
        "unbalanced), cost (the least predicted time to first token: queued prefill + uncached tokens + decode load), "
        "least_load, round_robin", choices=["cache_aware", "cost", "least_load", "round_robin"]
    )
    cache_threshold: float = opt(
        0.3, "cache_aware: send to the longest cached match only when it covers more than this share of the prompt"
    )
    balance_abs_threshold: int = opt(
        64, "cache_aware: loads are unbalanced when the busiest rank has this many more requests in flight ..."
    )
    balance_rel_threshold: float = opt(
        1.5, "... and more than this multiple of the idlest rank's; then the least-loaded rank gets the request"
    )
    decode_cost_tokens: int = opt(
        32, "cost: what one request in flight on a rank (decoding beside a new prefill) adds to its cost, in prompt tokens",
        min=0,
    )
    session_affinity: str = opt(
        "soft", "a session (prompt_cache_key, Claude Code's session id) stays on its rank: soft = while that rank is "
        "not the costlier choice (cost) or not overloaded (other policies); hard = while it is ready",
        choices=["soft", "hard"],
    )
    router_tokenizer: str | None = opt(
        None, "tokenizer for cache_aware matching: a .gguf or HF folder (default: the ranks' --model)"
    )
    health_check_interval: float = opt(1.0, "seconds between health probes of each rank")
    dp_aware: bool = opt(
        False, "accepted for SGLang Model Gateway / TokenSpeed command lines; the kvstrata gateway always "
        "routes to each rank itself (and pins a request's data_parallel_rank)"
    )
