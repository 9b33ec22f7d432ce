"""`serve --log-requests FILE [--log-requests-redact]`: each request body appended as a JSON line."""
from __future__ import annotations

import json
from pathlib import Path

import httpx

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import make_state, serve

BODY = {"messages": [{"role": "system", "content": "Time 12:30:45. Be brief."},
                     {"role": "user", "content": "hello there"}], "max_tokens": 2, "x_extra": 1}


def _post_and_read(engine: AsyncEngine, tmp_path: Path, redact: bool) -> list[dict]:
    log = tmp_path / "req.jsonl"
    state = make_state(engine, ServerConfig(port=0, log_requests=str(log), log_requests_redact=redact))
    with serve(state) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            assert http.post("/v1/chat/completions", json=BODY).status_code == 200
            assert http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 1}).status_code == 200
    state.request_log.close()
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_logs_each_body_as_sent(engine: AsyncEngine, tmp_path: Path) -> None:
    chat, completion = _post_and_read(engine, tmp_path, redact=False)
    assert chat["endpoint"] == "chat" and chat["body"] == BODY and chat["ts"] > 0  # unknown fields kept
    assert completion["endpoint"] == "completions" and completion["body"]["prompt"] == "abc"


def test_redacted_log_hides_words_keeps_shape(engine: AsyncEngine, tmp_path: Path) -> None:
    chat, completion = _post_and_read(engine, tmp_path, redact=True)
    system, user = (m["content"] for m in chat["body"]["messages"])
    assert "hello" not in user and "Be brief" not in system and completion["body"]["prompt"] != "abc"
    assert len(system) == len(BODY["messages"][0]["content"]) and system[5:13].replace(":", "").isdigit()
    assert [m["role"] for m in chat["body"]["messages"]] == ["system", "user"] and chat["body"]["max_tokens"] == 2


def test_responses_and_messages_log_the_chat_request_they_run_as(engine: AsyncEngine, tmp_path: Path) -> None:
    log = tmp_path / "req.jsonl"
    state = make_state(engine, ServerConfig(port=0, log_requests=str(log)))
    with serve(state) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            responses = {"input": [{"role": "user", "content": "hello there"}], "instructions": "Be brief.",
                         "max_output_tokens": 2, "store": False}
            assert http.post("/v1/responses", json=responses).status_code == 200
            messages = {"system": "Be brief.", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
            assert http.post("/v1/messages", json=messages).status_code == 200
    state.request_log.close()
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [entry["endpoint"] for entry in logged] == ["chat", "chat"]  # what `kvstrata analyze` renders
    for entry in logged:
        roles = [(m["role"], m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
                 for m in entry["body"]["messages"]]
        assert roles[-1] == ("user", "hello there") and "Be brief." in roles[0][1]
