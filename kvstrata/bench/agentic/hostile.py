"""Cache-hostile variants of the agentic workload (docs/workloads.md, "Cache-hostile prompts").

`hostile_requests(variant)` returns the chat request bodies a client would send (with canned
assistant replies), for `kvstrata analyze` to diagnose:
- stable: the plain agentic workload (nothing moves);
- timestamp: "Current time: <ISO time> request_id=<hex>" at the start of the system prompt;
- tools_reordered: the tool definition lines of the system prompt shuffled per request;
- tools_field_reordered: the tools sent in the `tools` field, shuffled per request (rendered with
  `TOOLS_TEMPLATE`: SmolLM2's own template ignores `tools`, so there order costs nothing);
- reasoning_dropped: the latest assistant reply carries reasoning_content, dropped once it is older
  (rendered with `REASONING_TEMPLATE`, which writes <think>reasoning</think> before the content);
- template_history: plain requests, to be rendered with `HISTORY_REWRITING_TEMPLATE`, which marks
  the latest user message, so that message renders differently once it becomes history.
"""
from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from typing import Any

from kvstrata.bench.agentic.workload import AgenticConfig, generate_agentic

VARIANTS = ("stable", "timestamp", "tools_reordered", "tools_field_reordered", "reasoning_dropped", "template_history")

# ChatML like SmolLM2's, but the last user turn is rendered as "user (latest)".
HISTORY_REWRITING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}"
    "{% if loop.last and message['role'] == 'user' %} (latest){% endif %}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ChatML that writes an assistant message's reasoning_content as <think>...</think> before its content.
REASONING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message.get('reasoning_content') %}<think>{{ message['reasoning_content'] }}</think>{% endif %}"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML that writes the `tools` field into the system turn, one JSON object per line (Hermes style).
TOOLS_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% if loop.first and tools %}<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {
    "template_history": HISTORY_REWRITING_TEMPLATE, "reasoning_dropped": REASONING_TEMPLATE,
    "tools_field_reordered": TOOLS_TEMPLATE,
}


def _reply(rng: random.Random, session: int, turn: int) -> str:
    return f"Reply {turn} of session {session}: " + " ".join(rng.choice(("ok", "done", "sure", "next")) for _ in range(8))


def hostile_requests(variant: str, sessions: int = 3, turns: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """Request bodies in send order (sessions interleaved turn by turn)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    workload = generate_agentic(AgenticConfig(agents=1, sessions=sessions, turns=turns, system_tokens=800,
                                              turn_tokens=40, seed=seed))
    rng = random.Random(f"kvstrata-hostile:{variant}:{seed}")
    clock = datetime(2026, 11, 30, 9, 0, 0, tzinfo=timezone.utc)
    replies: list[list[str]] = [[] for _ in range(sessions)]
    bodies: list[dict[str, Any]] = []
    for turn in range(turns):
        for s in range(sessions):
            messages = workload.messages(s, replies[s])
            body: dict[str, Any] = {"model": "smollm2", "messages": messages}
            system = messages[0]["content"]
            clock += timedelta(seconds=rng.randint(1, 90))
            if variant == "timestamp":
                stamp = f"Current time: {clock.isoformat()} request_id={rng.getrandbits(64):016x}\n"
                messages[0] = {"role": "system", "content": stamp + system}
            elif variant in ("tools_reordered", "tools_field_reordered"):
                head, rest = system.split("<tools>\n", 1)
                block, tail = rest.split("</tools>", 1)
                lines = block.splitlines(keepends=True)
                rng.shuffle(lines)
                if variant == "tools_reordered":
                    messages[0] = {"role": "system", "content": head + "<tools>\n" + "".join(lines) + "</tools>" + tail}
                else:
                    messages[0] = {"role": "system", "content": head + tail}
                    body["tools"] = [json.loads(line) for line in lines]
            elif variant == "reasoning_dropped" and turn > 0:
                # the client keeps reasoning_content on the latest assistant message only
                messages[-2] = {**messages[-2], "reasoning_content": f"Turn {turn - 1}: answer briefly."}
            bodies.append(body)
            replies[s].append(_reply(rng, s, turn))
    return bodies
