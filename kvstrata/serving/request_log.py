"""`--log-requests FILE`: append every request body to a JSON-lines file, for `kvstrata analyze`.

One line per request: `{"ts": unix seconds, "endpoint": "chat" | "completions", "body": {...}}`,
the body exactly as the client sent it (unknown fields included), plus `"prompt_cache_key"` beside
it when the body has one (a string; the session the client named, kept as is by the redaction).

`--log-requests-redact` keeps the shape but not the text: in message `content`,
`reasoning_content`, tool-call `arguments` and every string under `tools` (names and keys stay),
each run of letters or digits becomes a run of the same length and kind (letters stay letters,
digits stay digits), derived from a hash of the original run. Equal words give equal placeholders,
so identical prefixes stay identical and a changed word still shows where it changed (a timestamp
still reads as digits), while the words themselves cannot be read back without guessing them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_RUN = re.compile(r"[A-Za-z]+|[0-9]+")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_REDACTED_MESSAGE_FIELDS = ("content", "reasoning_content", "reasoning", "thinking")


def _placeholder(run: str) -> str:
    digest = hashlib.sha256(run.encode("utf-8")).digest()
    while len(digest) < len(run):
        digest += hashlib.sha256(digest).digest()
    if run.isdigit():
        return "".join(str(b % 10) for b in digest[: len(run)])
    out = [_LETTERS[b % 26] for b in digest[: len(run)]]
    return "".join(c.upper() if o.isupper() else c for c, o in zip(out, run))


def redact_text(text: str) -> str:
    """Each letter or digit run replaced by a same-length, same-kind run derived from its hash."""
    return _RUN.sub(lambda m: _placeholder(m.group(0)), text)


def _redact_strings(value: Any) -> Any:
    """Every string value (not dict keys) in a JSON value, redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [_redact_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact_strings(v) for k, v in value.items()}
    return value


def redact_body(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a request body with the user's text redacted (see the module docstring)."""
    out = dict(body)
    if isinstance(body.get("messages"), list):
        messages = []
        for message in body["messages"]:
            m = dict(message) if isinstance(message, dict) else message
            if isinstance(m, dict):
                for field in _REDACTED_MESSAGE_FIELDS:
                    if field in m:
                        m[field] = _redact_strings(m[field])
                if isinstance(m.get("tool_calls"), list):
                    m["tool_calls"] = [_redact_tool_call(c) for c in m["tool_calls"]]
            messages.append(m)
        out["messages"] = messages
    if "prompt" in body:
        out["prompt"] = _redact_strings(body["prompt"])
    if isinstance(body.get("tools"), list):
        out["tools"] = _redact_strings(body["tools"])
    return out


def _redact_tool_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = dict(call["function"])
    if "arguments" in function:
        function["arguments"] = _redact_strings(function["arguments"])
    return {**call, "function": function}


class RequestLog:
    """Appends request bodies to `path` (opened once, line-buffered); safe from several threads."""

    def __init__(self, path: str | Path, redact: bool = False) -> None:
        self.path = Path(path).expanduser()
        self.redact = redact
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        logger.info("request_log_open path=%s redact=%s", self.path, redact)

    def write(self, endpoint: str, raw_body: bytes) -> None:
        """Append one request; a body that is not a JSON object is skipped (it will get a 4xx anyway)."""
        try:
            body = json.loads(raw_body)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(body, dict):
            self.write_body(endpoint, body)

    def write_body(self, endpoint: str, body: dict[str, Any]) -> None:
        """Append one request already parsed (the chat request a Messages or Responses request runs as)."""
        if self.redact:
            body = redact_body(body)
        entry = {"ts": round(time.time(), 3), "endpoint": endpoint, "body": body}
        if isinstance(body.get("prompt_cache_key"), str):
            entry["prompt_cache_key"] = body["prompt_cache_key"]
        line = json.dumps(entry, ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()
