"""The response cache's benchmarks: `kvstrata bench repeat` (hot and unique prompts) and `kvstrata bench
locust` (EnergonAI's Locust test, cache off then on)."""
