"""The fake OpenAI peer as a server process with /health, for `bench compare` tests: `python THIS PORT [FLAGS]`.

Among FLAGS (what `compare` adds for an engine), `--response-cache-size N` turns its response cache on.
It prints what it was given and what it answered to stdout (which `compare` keeps as the engine's
log), one `FAKE {json}` line each: `{"flags": [...]}` at start, then `{"body": ..., "cache": header}`
per /v1/completions request.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.routing import Route

from _fake_openai_peer import FakePeer, _app


def say(record: dict[str, Any]) -> None:
    print("FAKE " + json.dumps(record), flush=True)


if __name__ == "__main__":
    flags = sys.argv[2:]
    say({"flags": flags})
    peer = FakePeer(url="", response_cache="--response-cache-size" in flags,
                    on_completion=lambda body, cache: say({"body": body, "cache": cache}))
    app = _app(peer)
    app.router.routes.append(Route("/health", lambda request: JSONResponse({"status": "ok"})))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
