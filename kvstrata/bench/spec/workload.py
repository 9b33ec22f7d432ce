"""The edit workload: agent turns whose replies copy what the agent already holds.

Three kinds of session, as agent loops send them (the issue's list; the numbers are ours):
- `code`: a source file (a slice of this repository's own Python, `--doc-tokens` long, ~3.5 characters
  a token) sent with "rename X to Y, reply with the whole file"; the next turn sends the file with that
  rename applied (by us, not by trusting the reply) and asks for another;
- `json`: a JSON task list sent with "set item i's status to V, reply with the whole JSON";
- `tool`: the same tool-call skeleton every turn: the previous calls in the history, "now call it for
  the next file".
Each session is a chain of turns (sent one after another); sessions run at once. Everything is made
from the seed and the repository's files: no download, the same prompts for every engine.
"""
from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
KINDS = ("code", "json", "tool")
CHARS_PER_TOKEN = 3.5
CODE_SYSTEM = ("You are a coding agent. When asked to change a file, reply with the whole changed file in one "
               "code block and nothing else.")
JSON_SYSTEM = "You keep a JSON state for an agent. Reply with the whole updated JSON and nothing else."
TOOL_SYSTEM = ('You call tools by replying with one JSON object {"tool": NAME, "arguments": {...}} and nothing '
               "else. Tools: read_file(path, start_line, end_line), write_file(path, content), run_tests(path).")
STATUSES = ("open", "in_progress", "blocked", "done", "review")


@dataclass(frozen=True)
class EditConfig:
    sessions: int = 6
    turns: int = 3
    doc_tokens: tuple[int, int] = (300, 1500)
    seed: int = 0

    def validate(self) -> None:
        if not 1 <= self.sessions <= 64:
            raise ValueError(f"--edit-sessions must be 1-64 (got {self.sessions})")
        if not 1 <= self.turns <= 20:
            raise ValueError(f"--edit-turns must be 1-20 (got {self.turns})")
        lo, hi = self.doc_tokens
        if not 50 <= lo <= hi <= 8000:
            raise ValueError(f"--doc-tokens needs 50 <= MIN <= MAX <= 8000 (got {lo}-{hi})")


@dataclass(frozen=True)
class Turn:
    session: int
    kind: str
    turn: int
    messages: list[dict[str, str]]


def source_files() -> list[Path]:
    return sorted(p for p in (REPO / "kvstrata").rglob("*.py") if p.stat().st_size > 2000)


def code_document(rng: random.Random, tokens: int) -> str:
    """A slice of one of the repository's files, cut at line ends, about `tokens` long."""
    files = source_files()
    text = files[rng.randrange(len(files))].read_text()
    want = int(tokens * CHARS_PER_TOKEN)
    lines, out, size = text.splitlines(), [], 0
    start = rng.randrange(max(1, len(lines) // 3))
    for line in lines[start:] + lines[:start]:
        if size + len(line) + 1 > want and out:
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def rename_target(rng: random.Random, doc: str) -> tuple[str, str]:
    """An identifier used at least twice in `doc` (skipping keywords-ish short words) and its new name."""
    words = Counter(re.findall(r"\b[a-z_][a-z0-9_]{4,}\b", doc))
    pool = sorted(w for w, n in words.items() if n >= 2 and w not in {"return", "import", "class", "while", "float"})
    old = rng.choice(pool) if pool else "value"
    return old, old + "_v2"


def json_state(rng: random.Random, tokens: int) -> dict[str, list[dict[str, object]]]:
    items = max(2, tokens // 30)  # one item ~30 tokens indented
    owners = ("ana", "bo", "cy", "dee")
    return {"tasks": [{"id": i, "title": f"task {i}: {rng.choice(['parse', 'index', 'route', 'cache'])} step",
                       "status": "open", "owner": rng.choice(owners), "estimate_h": rng.randint(1, 9)}
                      for i in range(items)]}


def session_turns(session: int, config: EditConfig) -> list[Turn]:
    """Session `session`'s turns, in order (its kind rotates with the session number)."""
    rng = random.Random(config.seed * 1000 + session)
    kind = KINDS[session % len(KINDS)]
    tokens = rng.randint(*config.doc_tokens)
    turns = []
    if kind == "code":
        doc = code_document(rng, tokens)
        for t in range(config.turns):
            old, new = rename_target(rng, doc)
            user = f"```python\n{doc}\n```\n\nRename `{old}` to `{new}` everywhere in this file."
            turns.append(Turn(session, kind, t, [{"role": "system", "content": CODE_SYSTEM},
                                                 {"role": "user", "content": user}]))
            doc = re.sub(rf"\b{re.escape(old)}\b", new, doc)
    elif kind == "json":
        state = json_state(rng, tokens)
        for t in range(config.turns):
            i, status = rng.randrange(len(state["tasks"])), rng.choice(STATUSES)
            user = (f"State:\n{json.dumps(state, indent=1)}\n\nSet the status of task {i} to \"{status}\". "
                    "Reply with the whole updated JSON.")
            turns.append(Turn(session, kind, t, [{"role": "system", "content": JSON_SYSTEM},
                                                 {"role": "user", "content": user}]))
            state["tasks"][i]["status"] = status
    else:
        files = [p.relative_to(REPO).as_posix() for p in source_files()]
        rng.shuffle(files)
        history: list[dict[str, str]] = [{"role": "system", "content": TOOL_SYSTEM}]
        for t in range(config.turns + 2):
            call = {"tool": "read_file", "arguments": {"path": files[t % len(files)], "start_line": 1, "end_line": 80}}
            history.append({"role": "user", "content": f"Read the first 80 lines of {files[t % len(files)]}."})
            if t >= 2:  # two calls in the history first: the skeleton to repeat
                turns.append(Turn(session, kind, t - 2, list(history)))
            history.append({"role": "assistant", "content": json.dumps(call)})
            history.append({"role": "user", "content": f"(tool result: {rng.randint(20, 80)} lines)"})
    return turns


def generate_edit(config: EditConfig) -> list[list[Turn]]:
    config.validate()
    return [session_turns(s, config) for s in range(config.sessions)]
