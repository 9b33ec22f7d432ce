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

A browser cannot send a Bearer header from the address bar, so `GET /dashboard?api_key=KEY` with
a good key serves the page and sets an HttpOnly, SameSite=Strict cookie (`COOKIE`) holding a
token derived from the key with this process's secret (never the key itself); the page's polls
of `/metrics` carry it. The cookie opens `COOKIE_PATHS` only, never `/v1/...` nor admin routes.
The DP gateway runs the same middleware with the same key sources.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import dataclass, field, replace
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstrata.config_flags import ConfigError
from kvstrata.config_server import ServerConfig
from kvstrata.serving.errors import error_response
from kvstrata.serving.prepare import PreparedRequest

logger = logging.getLogger(__name__)
ENV_KEY = "KVSTRATA_API_KEY"
OPEN_PATHS = frozenset({"/health"})
# operational routes --metrics-public opens (the DP gateway reads /v1/kvstrata/info)
OPERATOR_PREFIXES = ("/metrics", "/dashboard", "/flush_cache", "/response_cache", "/v1/kvstrata/")
COOKIE = "kvstrata_dashboard"
COOKIE_PATHS = frozenset({"/metrics", "/dashboard"})  # what the dashboard cookie opens


def _anonymous_tenant(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ApiKeys:
    """Key -> tenant. Empty means authentication is off."""

    tenants: dict[str, str]
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False, compare=False)

    @classmethod
    def from_config(cls, cfg: ServerConfig, environ: dict[str, str] | None = None) -> ApiKeys:
        """Read the flags, the key file and the environment; ConfigError names a bad file line."""
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

    @property
    def any_key(self) -> str | None:
        """A key of this server, for calls it makes to ranks holding the same keys (the DP gateway)."""
        return next(iter(self.tenants), None)

    def cookie_token(self, key: str) -> str:
        """What the dashboard cookie holds for `key`: an HMAC of it, useless elsewhere."""
        return hmac.new(self.secret, key.encode(), hashlib.sha256).hexdigest()

    def tenant_of_cookie(self, token: str) -> str | None:
        found = None
        for known, tenant in self.tenants.items():
            if hmac.compare_digest(self.cookie_token(known).encode(), token.encode()):
                found = tenant
        return found


def read_key_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"--api-key-file {path}: cannot read it ({exc})") from exc
    tenants: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ConfigError(f"--api-key-file {path}, line {number}: write `KEY TENANT` (two fields)")
        tenants[fields[0]] = fields[1] if len(fields) == 2 else _anonymous_tenant(fields[0])
    if not tenants:
        raise ConfigError(f"--api-key-file {path}: no keys in it; write one `KEY TENANT` per line")
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
    """The key of `Authorization: Bearer KEY`, or of `x-api-key: KEY` (Anthropic's clients send that)."""
    bearer = api_key = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and bearer is None:
            scheme, _, token = value.decode("latin-1").partition(" ")
            bearer = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        elif name == b"x-api-key" and api_key is None and value.strip():
            api_key = value.decode("latin-1").strip()
    return bearer if bearer is not None else api_key


def _cookie(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed Cookie header is no credential
                return None
            morsel = jar.get(COOKIE)
            return morsel.value if morsel is not None else None
    return None


def _query_key(scope: Scope) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key")
    return values[0] if values else None


def _refuse(given: bool) -> object:
    msg = (
        "Incorrect API key provided; send `Authorization: Bearer KEY` (or `x-api-key: KEY`) with a key this server "
        "was given"
        if given else
        "Missing API key; send `Authorization: Bearer KEY` or `x-api-key: KEY` (or open /dashboard?api_key=KEY in a "
        "browser)"
    )
    return error_response(401, msg, "invalid_request_error", code="invalid_api_key",
                          headers={"WWW-Authenticate": "Bearer"})


class AuthMiddleware:
    """401 with an OpenAI-style body unless the request carries a known key (`Authorization: Bearer` or
    `x-api-key`)."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, metrics_public: bool) -> None:
        self.app = app
        self.keys = keys
        self.metrics_public = metrics_public

    def _is_open(self, path: str) -> bool:
        if not self.keys.enabled or path in OPEN_PATHS:
            return True
        return self.metrics_public and path.startswith(OPERATOR_PREFIXES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys.enabled:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        token = _bearer(scope)
        query_key = _query_key(scope) if path == "/dashboard" and token is None else None
        given = token if token is not None else query_key
        tenant = self.keys.tenant_of(given) if given is not None else None
        if tenant is None and given is None and path in COOKIE_PATHS and (cookie := _cookie(scope)) is not None:
            tenant = self.keys.tenant_of_cookie(cookie)
            given = cookie
        if tenant is None and not self._is_open(path):
            logger.info("auth_refused path=%s reason=%s", path, "no_key" if given is None else "bad_key")
            await _refuse(given is not None)(scope, receive, send)  # type: ignore[operator]
            return
        scope.setdefault("state", {})["tenant"] = tenant
        if query_key is not None and tenant is not None:  # the browser keeps the key as a cookie
            send = self._setting_cookie(send, self.keys.cookie_token(query_key))
        await self.app(scope, receive, send)

    @staticmethod
    def _setting_cookie(send: Send, token: str) -> Send:
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict".encode()

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
            await send(message)

        return send_with_cookie
