"""Seeded generation of the agentic workload (docs/workloads.md, "Agentic").

An agent is a system prompt with tool definitions (JSON schemas, Hermes-style `<tools>` block);
every session is bound to one agent (session s -> agent s % agents) and owns a list of turns: a
user message or a tool result, both sent with role "user" so every peer's chat template and
validator accepts them (a `tool` role would need `tool_call_id`s the replies never carry).
The assistant replies are not generated here: the driver appends the real reply of the server.

Text is drawn from a fixed vocabulary of common English words, which most BPE tokenizers keep as
one token each, so `approx_tokens` tracks a real tokenizer's count closely. Each agent and session
has its own `random.Random` seeded from (seed, kind, index): adding sessions never changes agents.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

WORDS: tuple[str, ...] = tuple("""
the of and to in is you that it was for on are as with they at be this have from or one had by
word but not what all were we when your can said there use each which she do how their if will up
other about out many then them these so some her would make like into time has look two more write
go see number no way could people my than first water been call who its now find long down day did
get come made may part over new sound take only little work know place year live me back give most
very after thing our just name good sentence man think say great where help through much before
line right too mean old any same tell boy follow came want show also around form three small set
put end does another well large must big even such because turn here why ask went men read need
land different home us move try kind hand picture again change off play spell air away animal house
point page letter mother answer found study still learn should world high every near add food
between own below country plant last school father keep tree never start city earth eye light
thought head under story saw left few while along might close something seem next hard open example
begin life always those both paper together got group often run important until children side feet
car mile night walk white sea began grow took river four carry state once book hear stop without
second later miss idea enough eat face watch far really almost let above girl sometimes mountain
cut young talk soon list song being leave family order account report record customer invoice
payment shipping address product price status ticket message team project file document user
""".split())
VERBS: tuple[str, ...] = tuple(
    "get search list create update delete send check find read write cancel schedule fetch".split()
)
NOUNS: tuple[str, ...] = tuple(
    "order account report record customer invoice payment ticket message project file document "
    "user product address shipment calendar event note task contact weather".split()
)
TYPES: tuple[str, ...] = ("string", "integer", "number", "boolean", "array")
_PIECE = re.compile(r"[A-Za-z]+|[0-9]|\n|[^A-Za-z0-9\s]+")


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate: words, digits, newlines, punctuation runs."""
    return len(_PIECE.findall(text))


def check_ranges(checks: list[tuple[str, int, int, int]]) -> None:
    """Raise ValueError naming the first flag whose value is outside [low, high]."""
    for flag, value, low, high in checks:
        if not low <= value <= high:
            raise ValueError(f"{flag} must be in [{low}, {high}] (got {value})")


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


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


def _sentence(rng: random.Random, n_words: int) -> str:
    text = _words(rng, n_words)
    return text[0].upper() + text[1:] + "."


def prose(rng: random.Random, tokens: int) -> str:
    """Sentences of 6-18 words until about `tokens` tokens (one per word, one per period)."""
    sentences: list[str] = []
    left = tokens
    while left > 1:
        n = min(rng.randint(6, 18), left - 1)
        sentences.append(_sentence(rng, n))
        left -= n + 1
    return " ".join(sentences)


def _tool(rng: random.Random, name: str) -> dict[str, object]:
    properties: dict[str, dict[str, object]] = {}
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice(TYPES)
        prop: dict[str, object] = {"type": kind, "description": _sentence(rng, rng.randint(5, 12))}
        if kind == "array":
            prop["items"] = {"type": "string"}
        elif kind == "string" and rng.random() < 0.3:
            prop["enum"] = sorted({rng.choice(WORDS) for _ in range(rng.randint(2, 4))})
        properties[f"{rng.choice(NOUNS)}_{rng.choice(NOUNS)}"] = prop
    required = sorted(rng.sample(list(properties), k=rng.randint(1, len(properties))))
    parameters = {"type": "object", "properties": properties, "required": required}
    function = {"name": name, "description": _sentence(rng, rng.randint(8, 20)), "parameters": parameters}
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
