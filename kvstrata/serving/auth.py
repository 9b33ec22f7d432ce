"""API keys and tenants: who may call the server, and whose caches a request may touch.

Keys come from `--api-key KEY` (repeatable), `--api-key-file FILE` (one `KEY TENANT` per line,
`#` comments and blank lines skipped) and `$KVSTRATA_API_KEY`; with none the server is open and
every request belongs to no tenant. A key given without a tenant is its own tenant (named by a
hash of it, never the key itself).

| path                                      | needs a key                          |
|-------------------------------------------|--------------------------------------|
| `/health`                                 | never                                |
| `/metrics`, `/dashboard`, admin routes    | yes, unless `--metrics-public`       |
| everything else (`/v1/...`, docs, schema) | yes                                  |

The tenant of the key is put on the request (`request.state.tenant`); the routes mix it into the
prefix cache's `extra_key` and the response cache's key, so two tenants never share a KV page or
a cached response and neither can time the other's prompts.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from kvstrata.config import ServerConfig
from kvstrata.serving.errors import error_response
from kvstrata.serving.protocol import PreparedRequest

logger = logging.getLogger(__name__)
ENV_KEY = "KVSTRATA_API_KEY"
OPEN_PATHS = frozenset({"/health"})
# operational routes --metrics-public opens (the DP gateway reads /v1/kvstrata/info)
OPERATOR_PREFIXES = ("/metrics", "/dashboard", "/flush_cache", "/response_cache", "/v1/kvstrata/")


def _anonymous_tenant(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ApiKeys:
    """Key -> tenant. Empty means authentication is off."""

    tenants: dict[str, str]

    @classmethod
    def from_config(cls, cfg: ServerConfig, environ: dict[str, str] | None = None) -> ApiKeys:
        """Read the flags, the key file and the environment; ValueError names a bad file line."""
        env = os.environ if environ is None else environ
        tenants = {key: _anonymous_tenant(key) for key in cfg.api_key}
        if env.get(ENV_KEY):
            tenants[env[ENV_KEY]] = _anonymous_tenant(env[ENV_KEY])
        if cfg.api_key_file is not None:
            tenants.update(read_key_file(cfg.api_key_file))
        return cls(tenants)

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def tenant_of(self, key: str) -> str | None:
        """The key's tenant, or None for an unknown key (compared in constant time)."""
        found = None
        for known, tenant in self.tenants.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                found = tenant
        return found


def read_key_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ValueError(f"--api-key-file {path}: cannot read it ({exc})") from exc
    tenants: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ValueError(f"--api-key-file {path}, line {number}: write `KEY TENANT` (two fields)")
        tenants[fields[0]] = fields[1] if len(fields) == 2 else _anonymous_tenant(fields[0])
    if not tenants:
        raise ValueError(f"--api-key-file {path}: no keys in it; write one `KEY TENANT` per line")
    return tenants


def tenant_extra_key(tenant: str | None, cache_salt: str | None) -> str | None:
    """The prefix cache's extra_key: the tenant (length-prefixed, so no salt can forge another
    tenant's key) and the request's cache_salt."""
    if tenant is None:
        return cache_salt
    return f"{len(tenant)}:{tenant}\x00{cache_salt or ''}"


def request_tenant(request: Request) -> str | None:
    """The tenant AuthMiddleware found for this request (None when authentication is off)."""
    return getattr(request.state, "tenant", None)


def scoped_to_tenant(prepared: PreparedRequest, tenant: str | None) -> PreparedRequest:
    """`prepared` with the tenant mixed into its prefix-cache extra_key (unchanged without one)."""
    if tenant is None:
        return prepared
    params = replace(prepared.params, extra_key=tenant_extra_key(tenant, prepared.params.extra_key))
    return replace(prepared, params=params)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class AuthMiddleware:
    """401 with an OpenAI-style body unless the request carries a known `Authorization: Bearer` key."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, metrics_public: bool) -> None:
        self.app = app
        self.keys = keys
        self.metrics_public = metrics_public

    def _is_open(self, path: str) -> bool:
        if not self.keys.enabled or path in OPEN_PATHS:
            return True
        return self.metrics_public and path.startswith(OPERATOR_PREFIXES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        tenant = self.keys.tenant_of(token) if token is not None and self.keys.enabled else None
        if tenant is None and not self._is_open(scope["path"]):
            logger.info("auth_refused path=%s reason=%s", scope["path"], "no_key" if token is None else "bad_key")
            msg = (
                "Incorrect API key provided; send `Authorization: Bearer KEY` with a key this server was given"
                if token is not None else
                "Missing API key; send `Authorization: Bearer KEY`"
            )
            response = error_response(401, msg, "invalid_request_error", code="invalid_api_key",
                                      headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)
