"""The edit workload (kvstrata/bench/spec/workload.py): documents of the asked size, edits applied turn
to turn, the same prompts for the same seed, every kind present."""
from __future__ import annotations

import json
import re

import pytest

from kvstrata.bench.spec.workload import CHARS_PER_TOKEN, EditConfig, generate_edit


def test_sessions_rotate_kinds_and_are_reproducible() -> None:
    config = EditConfig(sessions=6, turns=3, doc_tokens=(300, 600), seed=1)
    sessions = generate_edit(config)
    assert [s[0].kind for s in sessions] == ["code", "json", "tool"] * 2
    assert all(len(s) == 3 and [t.turn for t in s] == [0, 1, 2] for s in sessions)
    assert [[t.messages for t in s] for s in generate_edit(config)] == [[t.messages for t in s] for s in sessions]
    other = generate_edit(EditConfig(sessions=6, turns=3, doc_tokens=(300, 600), seed=2))
    assert other[0][0].messages != sessions[0][0].messages


def test_a_code_session_sends_the_file_with_the_last_rename_applied() -> None:
    turns = generate_edit(EditConfig(sessions=1, turns=3, doc_tokens=(400, 400), seed=0))[0]
    docs = [re.search(r"```python\n(.*)\n```", t.messages[1]["content"], re.S).group(1) for t in turns]
    renames = [re.search(r"Rename `(\w+)` to `(\w+)`", t.messages[1]["content"]).groups() for t in turns]
    assert 0.5 * 400 * CHARS_PER_TOKEN <= len(docs[0]) <= 400 * CHARS_PER_TOKEN
    for (old, new), before, after in zip(renames, docs, docs[1:]):
        assert re.search(rf"\b{old}\b", before) and not re.search(rf"\b{old}\b", after)
        assert after == re.sub(rf"\b{old}\b", new, before)


def test_a_json_session_carries_its_state_forward() -> None:
    turns = generate_edit(EditConfig(sessions=2, turns=3, doc_tokens=(300, 300), seed=0))[1]
    states = [json.loads(t.messages[1]["content"].split("State:\n", 1)[1].split("\n\nSet", 1)[0]) for t in turns]
    for t, before, after in zip(turns, states, states[1:]):
        i, status = re.search(r'task (\d+) to "(\w+)"', t.messages[1]["content"]).groups()
        before["tasks"][int(i)]["status"] = status
        assert after == before


def test_a_tool_session_repeats_its_call_skeleton() -> None:
    turns = generate_edit(EditConfig(sessions=3, turns=2, seed=0))[2]
    calls = [m for m in turns[-1].messages if m["role"] == "assistant"]
    assert len(calls) == 3 and all(json.loads(c["content"])["tool"] == "read_file" for c in calls)


@pytest.mark.parametrize("config", [EditConfig(sessions=0), EditConfig(turns=0), EditConfig(doc_tokens=(900, 300))])
def test_bad_configs_are_refused(config: EditConfig) -> None:
    with pytest.raises(ValueError):
        config.validate()
