"""Bad server flags stop `kvstrata serve`/`route` with `kvstrata: error: ...` and exit 2, never a traceback."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.cli import main


@pytest.mark.parametrize("args, message", [
    (["serve", "--response-cache-size", "-1"], "--response-cache-size must be >= 0"),
    (["serve", "--response-cache-size", "4", "--response-cache-list-size", "0"], "--response-cache-list-size"),
    (["serve", "--response-cache-fixed-keys", "{tmp}/keys.jsonl"], "needs the cache on"),
    (["serve", "--response-cache-size", "4", "--response-cache-fixed-keys", "{tmp}/none.jsonl"], "no such file"),
    (["serve", "--response-cache-size", "4", "--response-cache-fixed-keys", "{tmp}/bad.jsonl"], "not JSON"),
    (["serve", "--dp-size", "2", "--response-cache-size", "-3"], "--response-cache-size must be >= 0"),
    (["serve", "--api-key-file", "{tmp}/none.txt"], "cannot read it"),
    (["route", "--worker", "http://127.0.0.1:9", "--api-key-file", "{tmp}/none.txt"], "cannot read it"),
    (["serve", "--request-body-timeout", "0"], "--request-body-timeout must be >= 0.01"),
])
def test_bad_flag_exits_2_with_a_message(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keys.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if argv[0] == "serve":
        argv += ["--model", str(tmp_path / "no-model")]  # never reached: the flags fail first
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "kvstrata: error: " in err and message in err and "Traceback" not in err, err
