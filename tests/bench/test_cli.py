"""The `kvstrata bench` table: every command parses and names a run function that exists."""
from __future__ import annotations

import argparse
import importlib

import pytest

from kvstrata.bench.cli import BENCH_COMMANDS, BenchCommand, add_bench_parser
from kvstrata.bench.response_cache import locust_compare


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(p.add_subparsers(dest="command"))
    return p


REQUIRED_ARGS = {"trace": ["trace.jsonl"], "agents": ["--model-file", "m.gguf"],  # commands with a required argument
                 "perplexity": ["text.txt"]}


@pytest.mark.parametrize("command", BENCH_COMMANDS, ids=lambda c: c.name)
def test_every_command_parses_and_resolves(command: BenchCommand) -> None:
    module, function = command.run.split(":")
    assert callable(getattr(importlib.import_module(module), function))
    argv = ["bench", command.name, *REQUIRED_ARGS.get(command.name, [])]
    assert parser().parse_args(argv).bench_command == command.name


def test_the_scripts_that_lived_in_bench_are_commands() -> None:
    names = {c.name for c in BENCH_COMMANDS}
    assert {"tiers-ttft", "locust", "bf16-drift", "radix-bookkeeping"} <= names


def test_the_locustfile_ships_with_the_package() -> None:
    locustfile = locust_compare.HERE / "locust" / "locustfile.py"
    assert locustfile.is_file() and "class GenerationUser(HttpUser)" in locustfile.read_text()


def test_bf16_drift_measures_bfloat16_or_this_cpus_auto_plan() -> None:
    assert parser().parse_args(["bench", "bf16-drift"]).dtype == "bfloat16"
    assert parser().parse_args(["bench", "bf16-drift", "--dtype", "auto"]).dtype == "auto"
    with pytest.raises(SystemExit):
        parser().parse_args(["bench", "bf16-drift", "--dtype", "float16"])
