"""The CLI is generated from the config dataclasses; out-of-range values are refused by name."""
from __future__ import annotations

import argparse

import pytest

from kvstrata.cli import build_parser, main
from kvstrata.config import CacheConfig, SchedulerConfig
from kvstrata.config_flags import ConfigError, add_arguments, check_config, from_namespace


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_flags_and_aliases_build_frozen_configs() -> None:
    ns = parse("--prefix-granularity", "32", "--disable-prefix-caching", "--max-num-seqs", "4")
    cache = from_namespace(CacheConfig, ns)
    assert cache.page_size == 32 and cache.enable_prefix_caching is False
    assert from_namespace(SchedulerConfig, ns).max_num_seqs == 4
    assert from_namespace(CacheConfig, parse()).enable_prefix_caching is True
    with pytest.raises(AttributeError):
        cache.page_size = 8  # type: ignore[misc]


def test_defaults_come_from_the_dataclass() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p, SchedulerConfig)
    assert from_namespace(SchedulerConfig, p.parse_args([])) == SchedulerConfig()


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--page-size", "0"], "--page-size"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--chunked-prefill-size", "-1"], "--chunked-prefill-size"),
        (["--max-total-tokens", "0"], "--max-total-tokens"),
        (["--port", "70000"], "--port"),
    ],
)
def test_out_of_range_flags_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_check_config_for_library_users() -> None:
    with pytest.raises(ConfigError, match="--max-num-batched-tokens"):
        check_config(SchedulerConfig(max_num_batched_tokens=0))
    check_config(SchedulerConfig())


def test_every_commands_help_renders() -> None:
    """argparse formats each help string with %: a bare "60%" in one crashed `kvstrata serve --help`."""
    parser = build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert subparsers
    for name, sub in subparsers[0].choices.items():
        assert sub.format_help(), name
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        for child in nested[0].choices.values() if nested else ():
            assert child.format_help()
