"""The KV cache's own benchmarks: `kvstrata bench tiers-ttft` (TTFT by the tier a prefix comes from) and
`kvstrata bench radix-bookkeeping` (the prefix cache's per-request bookkeeping, in-process)."""
