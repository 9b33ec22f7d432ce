"""The HTTP side of `kvstrata bench perplexity`: tokenize through the server, score a window through it.

Two endpoints of any OpenAI-compatible server with vLLM's extras:
- `POST /tokenize` `{"prompt": str[, "add_special_tokens": bool]}` -> `{"tokens": [...], "count": n}`;
- `POST /v1/completions` with the window's token ids as the prompt, `echo: true`, `logprobs: 0` and
  `max_tokens: 1`: OpenAI's legacy shape answers `choices[0].logprobs.token_logprobs`, one entry per
  prompt token (the first null) and one for the generated token.
Every way a server can fail us is a `ServerError` whose message is one line a user can act on.
"""
from __future__ import annotations

from typing import Any

import httpx

PROBE = "Hello, world."  # tokenized with and without special tokens to learn what the server puts first


class ServerError(Exception):
    """The server is unreachable, refused a request or answered something unusable."""


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("detail", body)
    except (ValueError, AttributeError, KeyError, TypeError):
        message = resp.text
    return " ".join(str(message).split())[:300]


class PerplexityClient:
    """A synchronous client for one server (the windows go one at a time: the score, not load, is measured)."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PerplexityClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, what: str = "") -> Any:
        """The JSON answer; `what` says in an error which request it was."""
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise ServerError(f"cannot reach {self.url}{path}: {exc.__class__.__name__}: {exc}") from None
        if resp.status_code >= 400:
            raise ServerError(f"{method} {path}{what} answered {resp.status_code}: {_error_text(resp)}")
        try:
            return resp.json()
        except ValueError:
            raise ServerError(f"{method} {path} answered {resp.status_code} with a body that is not JSON") from None

    def first_model(self) -> str:
        """The id of the first model `GET /v1/models` lists."""
        data = self._call("GET", "/v1/models")
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise ServerError("GET /v1/models listed no model: pass --model") from None

    def tokenize(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """The server's token ids of `text`; `add_special_tokens` None leaves it at the server's default."""
        body: dict[str, Any] = {"prompt": text}
        if add_special_tokens is not None:
            body["add_special_tokens"] = add_special_tokens
        data = self._call("POST", "/tokenize", body)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise ServerError("POST /tokenize answered no `tokens` list of ids")
        return tokens

    def special_prefix(self) -> list[int]:
        """The tokens the server's default tokenization puts before a text (a BOS, or none)."""
        default, plain = self.tokenize(PROBE), self.tokenize(PROBE, add_special_tokens=False)
        extra = len(default) - len(plain)
        if extra < 0 or default[extra:] != plain:
            raise ServerError("POST /tokenize's default tokens are not the plain ones behind a prefix; cannot "
                              "tell which special tokens start a window")
        return default[:extra]

    def echo_logprobs(self, model: str, window: list[int]) -> list[float | None]:
        """Per-token log-probabilities of `window` as a prompt (the first None), plus the generated token's."""
        body = {"model": model, "prompt": window, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 0}
        data = self._call("POST", "/v1/completions", body, f" (echo + logprobs, a {len(window)}-token prompt)")
        try:
            lps = data["choices"][0]["logprobs"]["token_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ServerError("POST /v1/completions answered no choices[0].logprobs.token_logprobs: "
                              "the server ignores echo/logprobs") from None
        if not isinstance(lps, list):
            raise ServerError("POST /v1/completions answered a token_logprobs that is not a list")
        return lps
