"""bench/machine.py: every bench JSON says which CPU (model, speed flags) and torch it ran on."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from kvstrata.bench.machine import machine_info, machine_line, with_machine
from kvstrata.bench.report import write_json


def test_machine_info_names_cpu_flags_and_torch() -> None:
    m = machine_info()
    assert m["torch_version"] == torch.__version__ and m["cpu_model"] and m["cpu_cores"] >= 1
    assert isinstance(m["cpu_flags"], list) and m["native_bf16"] in (True, False, None)
    assert machine_line().startswith(f"machine: {m['cpu_model']} (") and "torch " in machine_line()


def test_write_json_adds_the_machine_and_keeps_one_given(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    write_json({"requests": 3}, str(out))
    written = json.loads(out.read_text())
    assert written["requests"] == 3 and written["machine"] == machine_info()
    assert with_machine({"machine": {"cpu_model": "elsewhere"}})["machine"] == {"cpu_model": "elsewhere"}
