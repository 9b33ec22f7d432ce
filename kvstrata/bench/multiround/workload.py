"""Seeded generation of the multi-round QA workload (docs/workloads.md, "Multi-round QA"; LMCache's shape).

Every user shares one system prompt (`--system-tokens`, about 1000) and owns a history, its
starting context (`--history-tokens`, about 2000), sent with its first question. Each round asks
one question (`--question-tokens`); the server's answer (`--answer-tokens`, about 100) and the
next question are appended, and the whole conversation is re-sent:

    round 0: [system] [user: history + question 0]
    round r: [system] [user: history + question 0] [assistant: answer 0] ... [user: question r]

So a user's round r can reuse everything its round r - 1 sent and received, and a user's round 0
can reuse the shared system prompt. Users and rounds are `Session`s and `Turn`s, the agentic
driver's own types, so `drive_agentic` runs this workload unchanged.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from kvstrata.bench.agentic.workload import Session, Turn
from kvstrata.bench.args import check_ranges
from kvstrata.bench.text import approx_tokens, prose

# The peers compare starts serve 4096-token sequences (compare/engines.py); the last round must fit.
MAX_CONTEXT_TOKENS = 4096
TEMPLATE_TOKENS_PER_MESSAGE = 6  # `<|im_start|>role\n ... <|im_end|>\n`, about


@dataclass(frozen=True)
class MultiRoundConfig:
    num_users: int = 8
    num_rounds: int = 5
    system_tokens: int = 1000
    history_tokens: int = 2000
    question_tokens: int = 20
    answer_tokens: int = 100
    seed: int = 0

    def last_round_tokens(self) -> int:
        """About how many tokens the last round's prompt plus its answer take (template included)."""
        messages = 2 * self.num_rounds + 1
        body = self.system_tokens + self.history_tokens + self.num_rounds * (self.question_tokens + self.answer_tokens)
        return body + messages * TEMPLATE_TOKENS_PER_MESSAGE

    def validate(self) -> None:
        """Raise ValueError naming the flag when a parameter is outside the workload's shape."""
        checks = [
            ("--num-users", self.num_users, 1, 256),
            ("--num-rounds", self.num_rounds, 1, 30),
            ("--system-tokens", self.system_tokens, 20, 4000),
            ("--history-tokens", self.history_tokens, 0, 4000),
            ("--question-tokens", self.question_tokens, 5, 500),
            ("--answer-tokens", self.answer_tokens, 1, 1024),
        ]
        check_ranges(checks)
        if self.last_round_tokens() > MAX_CONTEXT_TOKENS:
            raise ValueError(
                f"the last round needs about {self.last_round_tokens()} tokens, more than the {MAX_CONTEXT_TOKENS} "
                "the peers serve: lower --num-rounds, --history-tokens, --system-tokens or --answer-tokens"
            )


@dataclass(frozen=True)
class MultiRoundWorkload:
    config: MultiRoundConfig
    system_prompt: str
    histories: tuple[str, ...]  # one per user
    sessions: tuple[Session, ...]  # one per user; turn 0 carries the history and question 0

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def messages(self, session_id: int, replies: list[str]) -> list[dict[str, str]]:
        """What user `session_id` sends in round `len(replies)`: system, then question/answer pairs."""
        session = self.sessions[session_id]
        if len(replies) >= len(session.turns):
            raise ValueError(f"user {session_id} has only {len(session.turns)} rounds")
        out = [{"role": "system", "content": self.system_prompt}]
        for turn, reply in zip(session.turns, replies):
            out.append({"role": "user", "content": turn.content})
            out.append({"role": "assistant", "content": reply})
        out.append({"role": "user", "content": session.turns[len(replies)].content})
        return out


def generate_multiround(config: MultiRoundConfig) -> MultiRoundWorkload:
    config.validate()
    system = _system_prompt(config)
    histories = tuple(_history(config, u) for u in range(config.num_users))
    sessions = tuple(_user(config, u, histories[u]) for u in range(config.num_users))
    return MultiRoundWorkload(config, system, histories, sessions)


def _rng(config: MultiRoundConfig, kind: str, index: int) -> random.Random:
    return random.Random(f"kvstrata-multiround:{config.seed}:{kind}:{index}")


def _system_prompt(config: MultiRoundConfig) -> str:
    head = "You are a helpful assistant. Answer the user's questions about the notes they share. "
    return head + prose(_rng(config, "system", 0), config.system_tokens - approx_tokens(head))


def _history(config: MultiRoundConfig, user: int) -> str:
    if config.history_tokens == 0:
        return ""
    head = f"Here are my notes, user {user}:\n"
    return head + prose(_rng(config, "history", user), config.history_tokens - approx_tokens(head))


def _question(rng: random.Random, round_: int, tokens: int) -> str:
    head = f"Question {round_ + 1}: "
    return head + prose(rng, max(2, tokens - approx_tokens(head) - 1)).rstrip(".") + "?"


def _user(config: MultiRoundConfig, user: int, history: str) -> Session:
    rng = _rng(config, "questions", user)
    questions = [_question(rng, r, config.question_tokens) for r in range(config.num_rounds)]
    first = f"{history}\n\n{questions[0]}" if history else questions[0]
    turns = (Turn("user", first), *(Turn("user", q) for q in questions[1:]))
    return Session(user, 0, turns)
