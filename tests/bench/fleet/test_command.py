"""`kvstrata bench fleet`'s flags: a bad one exits 2 naming it, before any server starts."""
from __future__ import annotations

import pytest

from kvstrata.cli import main


@pytest.mark.parametrize(("argv", "said"), [(["--policies", "nope"], "--policies"), (["--dp-size", "1"], "--dp-size"),
                                            (["--sessions", "0"], "--sessions"), (["--join-gap", "-1"], "--join-gap"),
                                            (["--kvstrata-args", "'unbalanced"], "quotation")])
def test_bad_flags_exit_2_before_any_server(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "fleet", *argv]) == 2
    assert said in capsys.readouterr().err
