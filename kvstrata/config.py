"""Frozen configuration dataclasses of the engine (model, KV cache, scheduler); the CLI is generated
from their fields. The HTTP processes' (a rank's server, the gateway) are in config_server.py.

With config_server.py, the one place for every default and its help text; kvstrata/config_flags.py
turns the fields into `--flag-name` options (`add_arguments`), builds the frozen instances from them
(`from_namespace`) and checks their bounds (`check_config`, `ConfigError`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GREEDY_BELOW = 1e-5  # sampling temperatures this small are argmax (dividing logits by them overflows)


def opt(default: Any, help: str, **extra: Any) -> Any:  # noqa: A002 - mirrors argparse
    """A dataclass field with CLI help (and optional `choices`, `flags`, `aliases`)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class ModelConfig:
    model: str = opt("smollm2", "model name (smollm2), a GGUF file or a Hugging Face folder")
    served_model_name: str | None = opt(None, "model id served over the API (default: --model's name)")
    dtype: str = opt(
        "auto",
        "weights/activations dtype; auto = per CPU: bfloat16 where it has avx512_bf16/AMX, else float32 "
        "prefill with int4 decode (kvstrata/model/dtype_plan.py); bfloat16 on CUDA",
        choices=["auto", "float32", "bfloat16", "float16"],
    )
    device: str = opt("cpu", "torch device: cpu or cuda[:N]")
    max_model_len: int | None = opt(None, "context length limit (default: the model's own)", min=2)
    num_threads: int | None = opt(None, "torch intra-op threads on CPU (default: all cores)", min=1)
    attention_backend: str = opt(
        "auto",
        "attention implementation: torch_sdpa (page gather + torch SDPA/matmuls), cpu_paged (decode rows "
        "read K/V pages in place in our C++ kernel, built with g++ on first use and cached under "
        "$KVSTRATA_HOME; bf16 prefill chunks in our AVX512-BF16 kernel where the CPU has it, else as "
        "torch_sdpa); auto = cpu_paged on CPU where it builds, else torch_sdpa",
        choices=["auto", "torch_sdpa", "cpu_paged"],
    )
    fused_ops: str = opt(
        "auto",
        "RMSNorm with the residual add before it, RoPE with the K/V write, and (AVX-512) silu(gate) * up as one C++ "
        "op each (kvstrata/model/csrc/) instead of ~10 torch ops; on x86 CPUs with AVX512-VNNI or AVX2 also the "
        "int4 decode linears and the int8 LM head on our integer-dot kernels; auto = on for CPU models not bound to "
        "match transformers exactly (bfloat16, or the int4 decode path), off for float32 on dense weights and on CUDA",
        choices=["auto", "off"],
    )
    fused_decode_layers: str = opt(
        "auto",
        "run every layer of a pure decode step in one C++ op call (kvstrata/model/csrc/decode_layers.cpp: the same "
        "kernels in the same order, the same bits, without ~11 op launches a layer from Python) where all of its "
        "ops are ours (int4 linears on our kernel, --fused-ops auto, cpu_paged attention); off = the Python loop",
        choices=["auto", "off"],
    )
    q4_decode: str = opt(
        "auto",
        "run steps of <= 8 rows (with prompt rows beside dense copies: <= 48 / the weights' bits) and "
        "decode-only steps of <= 32 on a GGUF's own quantized blocks "
        "(Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K; "
        "our integer-dot kernels on AVX512-VNNI/AVX2 CPUs, else torch's int4 kernel for Q4_0/Q4_1) instead of "
        "dense weights; auto = on with --dtype auto or bfloat16 on CPU, off for an explicit float32 (kept "
        "token-identical to transformers)",
        choices=["auto", "on", "off"],
    )
    prefill_weights: str = opt(
        "auto",
        "what wide (prefill) steps of a quantized GGUF multiply by: dense = dense copies of its linears "
        "(2-4 bytes a weight), dequant = each linear dequantized just before its GEMM (memory about the file's "
        "size), int = the integer-dot kernels as decode steps (no dense bytes); auto = int with 8-bit "
        "activations, else dense up to 3 GiB of dense weights, else dequant",
        choices=["auto", "dense", "dequant", "int"],
    )
    activation_bits: str = opt(
        "auto",
        "the integers our kernels multiply a GGUF's quantized blocks by in decode steps: 16 = each activation "
        "as two bytes (greedy output as float32's on the dequantized weights), 8 = one byte a value per block of "
        "32, as llama.cpp's Q8 activations (half the integer work; greedy output drifts more often); auto = 8 for "
        "GGUFs 2048 or more wide (the 1B-8B files people download), 16 below (SmolLM2)",
        choices=["auto", "8", "16"],
    )
    head_bits: str = opt(
        "auto",
        "the LM head of a quantized GGUF in decode steps: 8 = int8 a row, 4 = 4-bit blocks of 32 on the integer "
        "kernels (60%% of the bytes a step reads for it); either way each row's top 32 candidates (256 in steps that "
        "sample) are recomputed from the file's rows, so greedy output keeps the exact head's argmax; auto = 4 "
        "where activations are 8-bit (GGUFs 2048 or more wide), 8 below",
        choices=["auto", "8", "4"],
    )
    weights_cache: str = opt(
        "auto",
        "keep a GGUF's converted weights (the integer kernels' tiles, the quantized LM head) under "
        "$KVSTRATA_HOME/converted after its first load and map them at later starts (seconds less to healthy, "
        "about the quantized weights' size on disk); off = convert at every start",
        choices=["auto", "off"],
    )
    seed: int = opt(0, "global seed for requests that give none")
    malloc_tuning: str = opt(
        "auto",
        "on CPU, fix glibc malloc's mmap threshold (32 MiB) and heap trim threshold (1 GiB), so the memory a "
        "step frees is reused instead of unmapped and page-faulted in again, and keep to one malloc arena "
        "(kvstrata/engine/malloc_tuning.py); off = glibc's defaults",
        choices=["auto", "off"],
    )


@dataclass(frozen=True)
class CacheConfig:
    max_total_tokens: int | None = opt(
        None, "KV pool size in tokens (default: from --kv-cache-memory)", min=1
    )
    kv_cache_memory: float = opt(1.0, "KV pool size in GB when --max-total-tokens is not given", min=1e-6)
    page_size: int = opt(
        16,
        "tokens per KV page, the prefix-reuse boundary",
        aliases=["--prefix-granularity"],
        min=1,
    )
    enable_prefix_caching: bool = opt(
        True,
        "reuse KV of prompt prefixes seen before",
        flags=("--enable-prefix-caching", "--disable-prefix-caching"),
    )
    # KV cache events (kvstrata/kv/events.py), in vLLM's wire format.
    kv_events_config: str | None = opt(
        None,
        'KV cache events as vLLM\'s JSON: {"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:5557", "replay_endpoint": null, "buffer_steps": 10000, "hwm": 100000, '
        '"max_queue_size": 100000, "topic": ""}; rank r binds port + r',
    )
    data_parallel_rank: int = opt(
        0, "this engine's data-parallel rank: KV events carry it and use endpoint port + rank (set by --dp-size)"
    )
    # KV tiers beyond L1 (kvstrata/kv/tiers.py); TokenSpeed's flag names.
    enable_kvstore: bool = opt(
        True,
        "keep what L1 evicts in a host-memory L2 (and write through to --kvstore-storage-backend); "
        "needs prefix caching",
        flags=("--enable-kvstore", "--disable-kvstore"),
    )
    kvstore_ratio: float = opt(2.0, "L2 host pages as a multiple of the L1 pages", min=0.0)
    kvstore_size: float = opt(0.0, "L2 host memory in GB; overrides --kvstore-ratio when > 0", min=0.0)
    eviction_policy: str = opt(
        "slru", "L1/L2 eviction order: slru (segmented LRU) keeps reused pages and session continuations "
        "past one-off prompts (scan resistance, see docs/kv-tiers.md); lru is recency only", choices=["slru", "lru"],
    )
    prompt_cache_retention_quota: float = opt(
        0.5, "share of L2 that prompt_cache_retention \"24h\" pages may hold safe from other traffic",
        min=0.0, max=1.0,
    )
    kvstore_storage_backend: str | None = opt(
        None,
        "L3 store shared across restarts, ranks and machines (none: no L3)",
        choices=["file", "redis", "mooncake"],  # kvstrata/kv/store/registry.py: STORE_FACTORIES
    )
    kvstore_storage_backend_extra_config: str | None = opt(
        None,
        'JSON for the backend: file {"path", "max_size_gb"}; redis {"url", "ttl_s", "timeout_s"}; mooncake '
        '{"master_server_address", "metadata_server", "protocol", "global_segment_size", "local_buffer_size"}; '
        'any backend: "call_timeout_s" (10) abandons a store call that hangs (counted as a timeout error)',
    )
    kvstore_prefetch_min_pages: int = opt(
        2, "prefetch from L3 before admission when it holds at least this many more pages than L1+L2", min=1
    )
    kvstore_prefetch_timeout_base_s: float = opt(1.0, "prefetch deadline: base seconds ...", min=0.0)
    kvstore_prefetch_timeout_per_page_s: float = opt(0.01, "... plus this many seconds per page to fetch", min=0.0)
    kvstore_prefetch_batch_pages: int = opt(16, "pages per L3 read during a prefetch", min=1)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = opt(64, "most requests running at once", min=1)
    max_num_batched_tokens: int = opt(2048, "most tokens computed in one engine step", min=1)
    chunked_prefill_size: int | None = opt(
        None,
        "most prompt tokens one request prefills per step (default: the whole step budget; prefills "
        "take it first-come-first-served, so the oldest prompt finishes first)",
        min=1,
    )
    dedup_prefill: bool = opt(
        True,
        "a waiting request that shares prompt pages with a request still prefilling them waits for "
        "them to be cached instead of computing them too (needs prefix caching)",
        flags=("--enable-prefill-dedup", "--disable-prefill-dedup"),
    )
    prefill_finish_first: bool = opt(
        True,
        "a step in which a prompt finishes its prefill starts no other prompt's partial chunk (prompts that "
        "finish in it too still join), so the oldest prompt's first token is not held back by the next one's chunk",
        flags=("--enable-prefill-finish-first", "--disable-prefill-finish-first"),
    )
    speculative: str = opt(
        "auto",
        "speculative decoding from the agent's own context (kvstrata/engine/spec/): drafts from the request's "
        "prompt and output (ngram) and from its tenant's recent outputs (suffix), verified in one step; auto = "
        "suffix, off for a request whose drafts keep failing and for steps already wider than --spec-max-step-rows",
        choices=["auto", "off", "suffix", "ngram"],
    )
    num_speculative_tokens: int = opt(16, "most drafted tokens a request verifies in one step", min=1, max=64)
    spec_max_step_rows: int = opt(
        16, "auto: drafts are added only while the step stays within this many rows (decode rows are weight reads "
        "until then; wider steps are compute-bound)", min=1)
    max_n: int = opt(8, "largest `n` (choices per request) accepted", min=1)
    max_stop_strings: int = opt(16, "most stop strings per request", min=0)
    max_queue_requests: int = opt(
        1024, "most requests waiting for admission; beyond it new requests get 429 with Retry-After", min=1
    )
    scheduling_policy: str = opt(
        "slo",
        "slo: steps sized by time while requests decode (--tpot-target-ms) and prompts ordered so the most first "
        "tokens meet --ttft-target-ms (docs/scheduling.md); fcfs: steps sized by tokens, prompts by arrival",
        choices=["slo", "fcfs"],
    )
    ttft_target_ms: float = opt(
        2000.0, "the time-to-first-token target: the slo policy orders prompts by it; a finished request is counted "
        "against it (goodput and slack in /metrics)", min=1)
    tpot_target_ms: float = opt(
        200.0, "the time-per-output-token target: under the slo policy a step with decode rows takes only the "
        "prefill that keeps it within 3/4 of this; a finished request's mean is counted against it (/metrics)", min=1)
