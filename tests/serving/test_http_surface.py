"""docs/http-api.md lists exactly the routes the rank and the gateway serve (method, path, which app)."""
from __future__ import annotations

import re
from pathlib import Path

from serving_support import make_state

from kvstrata.config_server import ServerConfig
from kvstrata.router.app import build_gateway_app
from kvstrata.serving.auth import ApiKeys
from kvstrata.serving.openai_api import build_app

DOC = Path(__file__).resolve().parents[2] / "docs/http-api.md"
FASTAPI_OWN = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def served(app: object) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes for m in getattr(r, "methods", ()) or ()  # type: ignore[attr-defined]
            if m != "HEAD" and r.path not in FASTAPI_OWN}


def documented() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    rank, gateway = set(), set()
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] not in ("GET", "POST"):
            continue
        for path in re.findall(r"`([^`]+)`", cells[1]):
            if cells[2] == "yes":
                rank.add((cells[0], path))
            if cells[3] in ("yes", "proxied"):
                gateway.add((cells[0], path))
    return rank, gateway


def test_the_table_is_the_surface() -> None:
    rank, gateway = documented()
    assert rank and gateway
    assert served(build_app(make_state())) == rank
    assert served(build_gateway_app(object(), ServerConfig(port=0), ApiKeys({}))) == gateway  # type: ignore[arg-type]
