"""RunningServer keeps its server's log without the machine's paths."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from kvstrata.bench.compare.engines import EngineSpec, RunningServer


def test_the_kept_log_names_no_machine_path(tmp_path: Path) -> None:
    here = tempfile.gettempdir()
    line = f"cache at {Path.home()}/.cache/x and {here}/y"
    spec = EngineSpec("echo", lambda port, gguf: [sys.executable, "-c", f"print({line!r})"], "", "", 10.0)
    log = tmp_path / "logs" / "echo.log"
    with RunningServer(spec, 0, "", log) as srv:
        srv.proc.wait(timeout=30)
    text = log.read_text()
    assert "cache at" in text and str(Path.home()) + "/" not in text and here + "/" not in text, text
