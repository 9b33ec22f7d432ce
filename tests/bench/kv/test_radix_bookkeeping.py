"""`kvstrata bench radix-bookkeeping`: a short run reports every phase; flags it cannot run are refused."""
from __future__ import annotations

import pytest

from kvstrata.cli import main


def test_a_short_run_reports_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "radix-bookkeeping", "--requests", "20", "--cached-pages", "300",
                 "--prompt-tokens", "1536"]) == 0
    out = capsys.readouterr().out
    assert "20 requests x 1536 tokens" in out
    for phase in ("match", "lock+unlock", "hash suffix", "evict+alloc", "insert", "total"):
        assert f"  {phase} " in out


@pytest.mark.parametrize(("argv", "flag"), [(["--prompt-tokens", "1024"], "--prompt-tokens"),
                                            (["--requests", "0"], "--requests"),
                                            (["--page-size", "0"], "--page-size")])
def test_flags_it_cannot_run_exit_2_naming_the_flag(argv: list[str], flag: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "radix-bookkeeping", *argv]) == 2
    assert flag in capsys.readouterr().err
