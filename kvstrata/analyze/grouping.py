"""Sessions and agents of a request log, and the earlier request each request should reuse.

- Session: a request continues the latest earlier request whose conversation (the non-system
  messages, compared by role, content and tool calls; reasoning fields ignored) is a proper
  prefix of its own. Ignoring the system prompt and reasoning keeps a session together even when
  those move, which is exactly what the analyzer must then point at.
- Agent: requests with the same system prompt and tool set, compared with digit runs and long hex
  ids masked and lines sorted, so a timestamp or reordered tools do not split an agent.
A request with a `prompt_cache_key` belongs to that key's session instead: the client said which
requests belong together. (Its reference is found as below, so a divergence still shows.)
The reference of a request is its session predecessor (all of whose prompt it should reuse), else
the latest earlier request of its agent (whose system prompt it should reuse).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from kvstrata.analyze.rendered import Rendered, _text

_VOLATILE = re.compile(r"[0-9a-fA-F]{8,}|[0-9]+")
SESSION, AGENT = "session", "agent"


@dataclass(frozen=True)
class Reference:
    index: int  # the earlier request
    kind: str  # SESSION or AGENT
    shared_tokens: int  # tokens of the reference this request should have reused


@dataclass(frozen=True)
class Grouping:
    session_of: list[int]  # request -> session id (numbered by first request)
    agent_of: list[int]  # request -> agent id
    references: list[Reference | None]

    @property
    def num_sessions(self) -> int:
        return len(set(self.session_of))

    @property
    def num_agents(self) -> int:
        return len(set(self.agent_of))


def _message_key(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls")
    return json.dumps([message.get("role"), _text(message.get("content")), calls], sort_keys=True)


def _conversation(messages: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(_message_key(m) for m in messages if m.get("role") not in ("system", "developer"))


def agent_key(request: Rendered) -> str:
    system = "\n".join(_text(m.get("content")) for m in request.messages if m.get("role") in ("system", "developer"))
    lines = sorted(_VOLATILE.sub("#", system).splitlines())
    names = sorted(json.dumps(t, sort_keys=True)[:200] for t in request.tools or [])
    return json.dumps([lines, names])


def _system_tokens(request: Rendered) -> int:
    last = max((i for i, m in enumerate(request.messages) if m.get("role") in ("system", "developer")), default=-1)
    return request.span_end(last) if last >= 0 else 0


def group(requests: Sequence[Rendered]) -> Grouping:
    latest_by_conversation: dict[tuple[str, ...], int] = {}
    latest_by_agent: dict[str, int] = {}
    agent_ids: dict[str, int] = {}
    session_of: list[int] = []
    agent_of: list[int] = []
    references: list[Reference | None] = []
    sessions = 0
    session_by_key: dict[str, int] = {}
    for i, request in enumerate(requests):
        conversation = _conversation(request.messages)
        previous = next(
            (latest_by_conversation[conversation[:n]] for n in range(len(conversation) - 1, 0, -1)
             if conversation[:n] in latest_by_conversation),
            None,
        )
        key = agent_key(request)
        agent_of.append(agent_ids.setdefault(key, len(agent_ids)))
        if request.cache_key is not None and request.cache_key in session_by_key:
            session_of.append(session_by_key[request.cache_key])
        elif previous is not None and requests[previous].cache_key in (None, request.cache_key):
            session_of.append(session_of[previous])
        else:
            session_of.append(sessions)
            sessions += 1
        if request.cache_key is not None:
            session_by_key.setdefault(request.cache_key, session_of[-1])
        if previous is not None:
            references.append(Reference(previous, SESSION, len(requests[previous].ids)))
        else:
            same_agent = latest_by_agent.get(key)
            references.append(
                Reference(same_agent, AGENT, _system_tokens(requests[same_agent])) if same_agent is not None else None
            )
        latest_by_conversation[conversation] = i
        latest_by_agent[key] = i
    return Grouping(session_of, agent_of, references)
