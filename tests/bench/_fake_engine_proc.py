"""The fake OpenAI peer as a server process with /health, for `bench compare` tests: `python THIS PORT [FLAGS]`.

Among FLAGS (what `compare` adds for an engine), `--response-cache-size N` turns its response cache on.
"""
from __future__ import annotations

import sys

import uvicorn
from starlette.responses import JSONResponse
from starlette.routing import Route

from _fake_openai_peer import FakePeer, _app

if __name__ == "__main__":
    app = _app(FakePeer(url="", response_cache="--response-cache-size" in sys.argv[2:]))
    app.router.routes.append(Route("/health", lambda request: JSONResponse({"status": "ok"})))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
