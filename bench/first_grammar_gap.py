"""The first constrained request's effect on a concurrent stream's inter-token gap (issue 26).

A fresh `kvstrata serve --model smollm2` (warm-up on, as by default) from the code on PYTHONPATH; one
greedy chat stream of 600 tokens. After its 40th chunk, three chat requests with the same tool,
one after the other: A (tool_choice auto: warms the shared prefix), B (tool_choice required: the
server's first constrained request, its grammar compiled now), C (auto again). B and C have the
same cached prefix and a new user turn of the same length, so C's largest gap is what B would cost
the stream without any grammar work. Printed: the stream's median gap, and its largest gap while
B and while C ran. For the code before a change, export it and put it first on the path:

    git archive REV kvstrata | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python bench/first_grammar_gap.py before
    PYTHONPATH=. python bench/first_grammar_gap.py after
"""
from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

FORECAST = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 9},
                                             "units": {"enum": ["C", "F"]}},
            "required": ["city", "days", "units"], "additionalProperties": False}
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "forecast", "description": "Weather forecast",
                                                                 "parameters": FORECAST}}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(tag: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvstrata.cli", "serve", "--model", "smollm2", "--port", str(port),
                             "--max-total-tokens", "8192", "--log-level", "warning"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None
            time.sleep(0.5)
        stamps: list[float] = []

        def stream() -> None:
            body = {"messages": [{"role": "user", "content": "Tell me a long story about the sea."}], "max_tokens": 600,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        stamps.append(time.monotonic())

        t = threading.Thread(target=stream)
        t.start()
        while len(stamps) < 40:
            time.sleep(0.005)
        windows: dict[str, tuple[float, float]] = {}
        for name, city, choice in (("A", "Paris", "auto"), ("B", "Tokyo", "required"), ("C", "Lagos", "auto")):
            sent = time.monotonic()
            r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
                "messages": [{"role": "user", "content": f"Weather in {city} for 3 days?"}], "tools": TOOLS,
                "tool_choice": choice, "max_tokens": 24, "temperature": 0})
            assert r.status_code == 200, r.text
            windows[name] = (sent, time.monotonic())
        t.join()
        assert len(stamps) > 100 and stamps[-1] > windows["C"][1], "the stream ended before the requests did"
        gaps = [(b - a, b) for a, b in zip(stamps, stamps[1:])]
        worst = {k: max([g for g, at in gaps if s <= at <= e + 0.001] or [0.0]) * 1e3 for k, (s, e) in windows.items()}
        median = statistics.median(g for g, _ in gaps) * 1e3
        print(f"{tag}: median gap {median:.1f} ms; largest gap while the first constrained request ran "
              f"{worst['B']:.0f} ms, while the unconstrained one after it ran {worst['C']:.0f} ms", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    run_once(sys.argv[1] if len(sys.argv) > 1 else "this tree")
