"""Every benchmark users run again, as `kvstrata bench <command>` (cli.py's table).

One package per benchmark family: agentic/ (with the scan and the cache-hostile variants), agents/ (the real
agent CLIs), fleet/ (sessions behind `--dp-size N`), multiround/, throughput/ (offline and the HTTP probe),
compare/ (each engine in turn), spec/ (the edit workload), trace/ (Mooncake traces, live and simulated),
response_cache/ (repeat, locust), kv/ (tiers-ttft, radix-bookkeeping), perplexity/, synth/ (synth-model:
random-weight GGUFs of real shapes). A command of one module stays a module here (soak.py,
bf16_drift.py), beside what the families share: args.py (flags), client.py (the streaming client),
text.py (seeded prose), report.py (achievable tokens, the summary), machine.py, plot_base.py.
The repository's top-level bench/ holds results, the traces, the peers' scripts and one-off measurement
scripts (bench/README.md).
"""
