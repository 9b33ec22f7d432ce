"""What an Anthropic client says about caching, read into the engine's terms.

- The session: Claude Code sends `X-Claude-Code-Session-Id` on every request, and
  `metadata.user_id` as a JSON string holding `session_id` (older versions: `..._session_<id>`).
  It becomes the request's `prompt_cache_key`, the key the DP gateway keeps a session on its rank by.
- `cache_control` breakpoints (`{"type": "ephemeral"}`, 5 minutes, or with `"ttl": "1h"`) on system
  blocks, tools, message blocks, or the request itself (after its last block). The prompt's tokens up
  to the last breakpoint are retained for the longest TTL asked (`retention` "5m" / "1h": RETAINED pages
  in L1 and L2, within `--prompt-cache-retention-quota`, and the TTL in L3), and the tokens up to it that
  were not read from the cache count as `cache_creation_input_tokens`. A breakpoint is placed at the end
  of the chat message holding its block (tools are rendered with the system prompt: the system
  message's end); its token count is where the prompt rendered up to that message stops being the
  prompt's prefix.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from kvstrata.engine.sampling_params import PROMPT_CACHE_KEY_MAX_CHARS, InvalidRequestError
from kvstrata.serving.messages.request import MessagesRequest
from kvstrata.serving.prepare import PreparedRequest
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.tool_calls.plan import template_input

if TYPE_CHECKING:
    from kvstrata.model.tokenizer import Tokenizer

SESSION_HEADER = "x-claude-code-session-id"
_SESSION_SUFFIX = re.compile(r"_session_([0-9A-Za-z-]+)$")


def session_key(headers: Mapping[str, str], metadata: Mapping[str, Any] | None) -> str | None:
    """The client's session id (the header first, then metadata.user_id), or None."""
    found = headers.get(SESSION_HEADER)
    user = (metadata or {}).get("user_id")
    if not found and isinstance(user, str):
        try:
            parsed = json.loads(user)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("session_id"), str):
            found = parsed["session_id"]
        elif (m := _SESSION_SUFFIX.search(user)) is not None:
            found = m.group(1)
    return found[:PROMPT_CACHE_KEY_MAX_CHARS] if found else None


class Breakpoint(NamedTuple):
    messages: int  # the breakpoint is at the end of this many chat messages
    ttl: str  # "5m" | "1h"


def _ttl(control: Any, param: str) -> str | None:
    if control is None:
        return None
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise InvalidRequestError(f"{param} must be {{'type': 'ephemeral'}} (with an optional ttl)", param)
    ttl = control.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise InvalidRequestError(f"{param}.ttl must be '5m' or '1h'", f"{param}.ttl")
    return str(ttl)


def breakpoint_of(req: MessagesRequest, ends: list[int], has_system: bool) -> Breakpoint | None:
    """The request's last cache_control breakpoint and the longest TTL it asks for; None without any."""
    marks: list[tuple[int, str | None]] = [(ends[-1] if ends else 0, _ttl(req.cache_control, "cache_control"))]
    for k, block in enumerate(req.system if isinstance(req.system, list) else []):
        marks.append((1, _ttl(block.get("cache_control") if isinstance(block, dict) else None,
                              f"system[{k}].cache_control")))
    for k, tool in enumerate(req.tools or []):
        marks.append((int(has_system), _ttl(tool.get("cache_control") if isinstance(tool, dict) else None,
                                             f"tools[{k}].cache_control")))
    for i, message in enumerate(req.messages):
        content = message.get("content") if isinstance(message, dict) else None
        for k, block in enumerate(content if isinstance(content, list) else []):
            marks.append((ends[i], _ttl(block.get("cache_control") if isinstance(block, dict) else None,
                                        f"messages[{i}].content[{k}].cache_control")))
    found = [(n, ttl) for n, ttl in marks if ttl is not None and n > 0]
    if not found:
        return None
    return Breakpoint(max(n for n, _ in found), "1h" if any(ttl == "1h" for _, ttl in found) else "5m")


def prefix_tokens(chat: ChatCompletionRequest, messages: int, tokenizer: Tokenizer, parser: str,
                  prompt: list[int]) -> int:
    """How many of `prompt`'s tokens the conversation's first `messages` messages render to (the part
    of their rendering that is a prefix of the prompt: a template may render a last message apart)."""
    head = chat.model_copy(update={"messages": chat.messages[:messages]})
    try:  # rendered as prepare_chat renders it, without its checks and grammar (the request passed them)
        shown, tools = template_input(head, tokenizer, parser)
        text = tokenizer.apply_chat_template(shown, add_generation_prompt=False, tools=tools, **chat.template_kwargs())
    except Exception:  # noqa: BLE001 - a template that will not end there: no breakpoint, nothing retained
        return 0
    return len(os.path.commonprefix([tokenizer.encode(text), prompt]))


def with_breakpoint(prepared: PreparedRequest, chat: ChatCompletionRequest, mark: Breakpoint | None,
                    tokenizer: Tokenizer, parser: str) -> tuple[PreparedRequest, int]:
    """(the request retaining its prompt up to the breakpoint, the breakpoint's token count)."""
    if mark is None:
        return prepared, 0
    n = prefix_tokens(chat, mark.messages, tokenizer, parser, prepared.prompts[0])
    if n == 0:
        return prepared, 0
    return replace(prepared, params=replace(prepared.params, retention=mark.ttl, retain_tokens=n)), n
