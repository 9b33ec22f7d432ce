"""Raw speed: `kvstrata bench throughput` (offline, kvstrata beside transformers) and the HTTP probe
(cold prefill, decode at batch 1 and 8) that `bench compare` runs against every engine."""
