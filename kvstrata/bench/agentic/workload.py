"""Seeded generation of the agentic workload (docs/workloads.md, "Agentic").

An agent is a system prompt with tool definitions (JSON schemas, Hermes-style `<tools>` block);
every session is bound to one agent (session s -> agent s % agents) and owns a list of turns: a
user message or a tool result, both sent with role "user" so every peer's chat template and
validator accepts them (a `tool` role would need `tool_call_id`s the replies never carry).
The assistant replies are not generated here: the driver appends the real reply of the server.

Text is prose of common English words (bench/text.py), whose token count `approx_tokens` tracks
closely without a tokenizer. Each agent and session has its own `random.Random` seeded from (seed, kind, index): adding sessions never changes agents.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

from kvstrata.bench.args import check_ranges
from kvstrata.bench.text import WORDS, approx_tokens, prose, sentence

VERBS: tuple[str, ...] = tuple(
    "get search list create update delete send check find read write cancel schedule fetch".split()
)
NOUNS: tuple[str, ...] = tuple(
    "order account report record customer invoice payment ticket message project file document "
    "user product address shipment calendar event note task contact weather".split()
)
TYPES: tuple[str, ...] = ("string", "integer", "number", "boolean", "array")


@dataclass(frozen=True)
class AgenticConfig:
    agents: int = 1
    sessions: int = 8
    turns: int = 6
    system_tokens: int = 1500
    turn_tokens: int = 100
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the flag when a parameter is outside the documented shape."""
        checks = [
            ("--agents", self.agents, 1, 64),
            ("--sessions", self.sessions, 1, 64),
            ("--turns", self.turns, 2, 30),
            ("--system-tokens", self.system_tokens, 800, 4000),
            ("--turn-tokens", self.turn_tokens, 20, 200),
        ]
        check_ranges(checks)
        if self.agents > self.sessions:
            raise ValueError(f"--agents ({self.agents}) must not exceed --sessions ({self.sessions})")


@dataclass(frozen=True)
class Agent:
    agent_id: int
    tool_names: tuple[str, ...]
    system_prompt: str


@dataclass(frozen=True)
class Turn:
    kind: str  # "user" (a user message) or "tool_result" (a tool's output, sent as role "user")
    content: str


@dataclass(frozen=True)
class Session:
    session_id: int
    agent_id: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class AgenticWorkload:
    config: AgenticConfig
    agents: tuple[Agent, ...]
    sessions: tuple[Session, ...]

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def messages(self, session_id: int, replies: list[str]) -> list[dict[str, str]]:
        """The whole history re-sent for turn `len(replies)`: system, then turn/reply pairs."""
        session = self.sessions[session_id]
        if len(replies) >= len(session.turns):
            raise ValueError(f"session {session_id} has only {len(session.turns)} turns")
        out = [{"role": "system", "content": self.agents[session.agent_id].system_prompt}]
        for turn, reply in zip(session.turns, replies):
            out.append({"role": "user", "content": turn.content})
            out.append({"role": "assistant", "content": reply})
        out.append({"role": "user", "content": session.turns[len(replies)].content})
        return out


def generate_agentic(config: AgenticConfig) -> AgenticWorkload:
    config.validate()
    agents = tuple(_agent(config, i) for i in range(config.agents))
    sessions = tuple(_session(config, s, agents[s % config.agents]) for s in range(config.sessions))
    return AgenticWorkload(config, agents, sessions)


def _rng(config: AgenticConfig, kind: str, index: int) -> random.Random:
    return random.Random(f"kvstrata-agentic:{config.seed}:{kind}:{index}")


def _tool(rng: random.Random, name: str) -> dict[str, object]:
    properties: dict[str, dict[str, object]] = {}
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice(TYPES)
        prop: dict[str, object] = {"type": kind, "description": sentence(rng, rng.randint(5, 12))}
        if kind == "array":
            prop["items"] = {"type": "string"}
        elif kind == "string" and rng.random() < 0.3:
            prop["enum"] = sorted({rng.choice(WORDS) for _ in range(rng.randint(2, 4))})
        properties[f"{rng.choice(NOUNS)}_{rng.choice(NOUNS)}"] = prop
    required = sorted(rng.sample(list(properties), k=rng.randint(1, len(properties))))
    parameters = {"type": "object", "properties": properties, "required": required}
    function = {"name": name, "description": sentence(rng, rng.randint(8, 20)), "parameters": parameters}
    return {"type": "function", "function": function}


def _agent(config: AgenticConfig, agent_id: int) -> Agent:
    rng = _rng(config, "agent", agent_id)
    head = (
        f"You are agent {agent_id}, an assistant that works for the {rng.choice(NOUNS)} team. "
        f"{prose(rng, 60)}\n\n# Tools\n\nYou may call one or more functions to help with the "
        "request. Function signatures are given within <tools></tools> tags:\n<tools>\n"
    )
    tail = "</tools>\n\n# Rules\n\n"
    budget = config.system_tokens - approx_tokens(head + tail)
    names: list[str] = []
    lines: list[str] = []
    while True:
        name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
        if name in names:
            continue
        line = json.dumps(_tool(rng, name)) + "\n"
        if approx_tokens(line) > budget - 20 and lines:  # keep room for the rules prose
            break
        names.append(name)
        lines.append(line)
        budget -= approx_tokens(line)
    prompt = head + "".join(lines) + tail + prose(rng, budget)
    return Agent(agent_id, tuple(names), prompt)


def _user_message(rng: random.Random, tokens: int) -> str:
    return prose(rng, tokens)


def _tool_result(rng: random.Random, tool: str, tokens: int) -> str:
    """A Hermes-style tool response; a bare JSON object when short, a list of results when long."""
    if tokens < 40:
        head = f"{{\"name\": \"{tool}\", \"content\": "
        return head + json.dumps(prose(rng, tokens - approx_tokens(head) - 2)) + "}"
    head = f"<tool_response>\n{{\"name\": \"{tool}\", \"content\": "
    tail = "}\n</tool_response>"
    budget = tokens - approx_tokens(head + tail) - 4
    results: list[dict[str, object]] = []
    while budget > 8:
        item: dict[str, object] = {"id": rng.randint(1000, 99999), "status": rng.choice(NOUNS)}
        item["note"] = prose(rng, min(budget - approx_tokens(json.dumps(item)) - 4, 30))
        results.append(item)
        budget -= approx_tokens(json.dumps(item)) + 1
    return head + json.dumps({"results": results}) + tail


def _session(config: AgenticConfig, session_id: int, agent: Agent) -> Session:
    rng = _rng(config, "session", session_id)
    turns: list[Turn] = []
    for i in range(config.turns):
        tokens = round(config.turn_tokens * rng.uniform(0.9, 1.1))
        if i > 0 and rng.random() < 0.6:
            turns.append(Turn("tool_result", _tool_result(rng, rng.choice(agent.tool_names), tokens)))
        else:
            turns.append(Turn("user", _user_message(rng, tokens)))
    return Session(session_id, agent.agent_id, tuple(turns))
