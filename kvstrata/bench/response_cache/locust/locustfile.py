"""EnergonAI's response-cache load test, against kvstrata's /v1/completions.

Each simulated user loops forever over five sequential requests for the same prompt with
max_tokens 16, 32, 64, 128, 256 and no wait between them; HTTP 200 counts as success. Run it
headless with `make bench-locust` (cache off, then on) or by hand:

    .venv/bin/locust -f kvstrata/bench/response_cache/locust/locustfile.py --headless -u 4 -r 4 -t 60s --host http://127.0.0.1:8011

The model id comes from KVSTRATA_MODEL (default smollm2).
"""
from __future__ import annotations

import os

from locust import HttpUser, task

PROMPT = "Question: What is the longest river on the earth? Answer:"
MAX_TOKENS = (16, 32, 64, 128, 256)
MODEL = os.environ.get("KVSTRATA_MODEL", "smollm2")


class GenerationUser(HttpUser):
    @task
    def generate(self) -> None:
        for max_tokens in MAX_TOKENS:
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens}
            with self.client.post("/v1/completions", json=body, name=f"/v1/completions max_tokens={max_tokens}",
                                  catch_response=True) as response:
                if response.status_code == 200:
                    response.success()
                else:
                    response.failure(f"HTTP {response.status_code}")
