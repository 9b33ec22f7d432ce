"""A reply's reasoning as a Responses `reasoning` item, and an input `reasoning` item's text.

Output: `{"type": "reasoning", "id": "rs_...", "summary": [], "content": [{"type": "reasoning_text",
"text": ...}]}`: no summariser runs here, so `summary` stays empty whatever `reasoning.summary` asks
and the reasoning itself is in `content` (streamed as response.reasoning_text.delta events). With
`include: ["reasoning.encrypted_content"]` the item also carries `encrypted_content`.

encrypted_content is our own opaque token, for clients that keep nothing on the server (`store:
false`, as Codex) to send back in `input`: "kvs1." + base64url of the JSON {"text": reasoning}. It is
neither encrypted nor signed, by choice: it holds only what the client already got in `content`, and
decoded it only goes into the same tenant's own prompt, which the client may write as it likes (an
assistant message's `reasoning_content` does the same). A signature with a per-process secret would
buy nothing and would break every token after a restart, or on another DP rank. A token that does not
decode (another server's, or edited) is a 400 naming it.

Input: a reasoning item's text is its encrypted_content decoded, else its reasoning_text parts
joined; summaries alone are not the reasoning and are dropped. The text becomes the
`reasoning_content` of the assistant message after it, so the template re-renders the reasoning
exactly as the model wrote it.
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from kvstrata.engine.sampling_params import InvalidRequestError

TOKEN_PREFIX = "kvs1."
ENCRYPTED_CONTENT = "reasoning.encrypted_content"


def encode_reasoning(text: str) -> str:
    payload = json.dumps({"text": text}, ensure_ascii=False, separators=(",", ":")).encode()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(payload).decode("ascii")


def decode_reasoning(token: str, param: str) -> str:
    """The reasoning text of one of our tokens; a 400 naming `param` for anything else."""
    try:
        if not token.startswith(TOKEN_PREFIX):
            raise ValueError("not ours")
        text = json.loads(base64.urlsafe_b64decode(token[len(TOKEN_PREFIX):].encode("ascii")))["text"]
        if not isinstance(text, str):
            raise ValueError("no text")
    except (ValueError, KeyError, TypeError, UnicodeError, binascii.Error):
        raise InvalidRequestError(f"{param} was not issued by this server (kvstrata's start with {TOKEN_PREFIX!r}); "
                                  "send the reasoning item as this server returned it, or drop it", param) from None
    return text


def reasoning_item(item_id: str, text: str, encrypted: bool, status: str = "completed") -> dict[str, Any]:
    parts = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    item: dict[str, Any] = {"type": "reasoning", "id": item_id, "summary": [], "content": parts, "status": status}
    if encrypted and status == "completed":
        item["encrypted_content"] = encode_reasoning(text)
    return item


def input_reasoning(item: dict[str, Any], param: str) -> str | None:
    """The reasoning text of an input reasoning item (None: it carries none)."""
    token = item.get("encrypted_content")
    if token is not None:
        if not isinstance(token, str):
            raise InvalidRequestError(f"{param}.encrypted_content must be a string", f"{param}.encrypted_content")
        return decode_reasoning(token, f"{param}.encrypted_content")
    content = item.get("content")
    if content is None:
        return None
    if not isinstance(content, list):
        raise InvalidRequestError(f"{param}.content must be a list of reasoning_text parts", f"{param}.content")
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("reasoning_text", "text") \
                or not isinstance(part.get("text"), str):
            raise InvalidRequestError(f"{param}.content[{k}] must be a reasoning_text part", f"{param}.content[{k}]")
        texts.append(part["text"])
    return "".join(texts) if texts else None
