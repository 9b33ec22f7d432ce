"""`GET /dashboard`: one self-contained HTML page (static/dashboard.html, package data) that polls
`./metrics` about once a second and charts hit rate per tier, response-cache hits, TTFT p50/p99, the
share of requests that met both latency targets with the median slack of each, requests running/waiting
and KV pool usage. No CDN, no JS library: canvas drawn by hand.

`install_dashboard_route(app)` mounts it on any FastAPI app that also serves `/metrics` in
kvstrata's (or vLLM's) Prometheus names: the server does, and so does the DP gateway, whose
/metrics holds every rank's series (labelled `rank`; the page sums them, and averages KV usage).

With API keys on and no --metrics-public, open `/dashboard?api_key=KEY`: the auth middleware
(auth.py) serves the page and sets an HttpOnly cookie that the page's polls of ./metrics carry.
"""
from __future__ import annotations

import functools
from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse


@functools.lru_cache(maxsize=1)
def dashboard_html() -> str:
    return files("kvstrata.serving").joinpath("static/dashboard.html").read_text(encoding="utf-8")


def install_dashboard_route(app: FastAPI, path: str = "/dashboard") -> None:
    @app.get(path, response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html(), headers={"Cache-Control": "no-cache"})
