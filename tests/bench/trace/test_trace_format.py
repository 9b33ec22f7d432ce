"""Trace parsing: every bad line is named; gzipped or plain; the ideal hit rate; the Mooncake trace's 0.6512."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from kvstrata.bench.trace.format import TraceError, ideal_hit_rate, leading_seen, load_trace, select, unique_blocks

MOONCAKE_TRACE = Path(__file__).resolve().parents[3] / "bench/traces/synthetic_trace.jsonl.gz"


def write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def req(ts: float, n_in: int, ids: list[int], n_out: int = 4) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


GOOD = req(0, 600, [1, 2])


@pytest.mark.parametrize("bad, message", [
    ("{not json", "trace.jsonl:2: not valid JSON"),
    ("[1, 2]", "trace.jsonl:2: expected a JSON object"),
    ({"timestamp": 5, "input_length": 10, "hash_ids": [1]}, "trace.jsonl:2: missing field 'output_length'"),
    ({"input_length": 10, "output_length": 1}, "trace.jsonl:2: missing field 'timestamp', 'hash_ids'"),
    (req(5, 1024, [1, 2, 3]), "trace.jsonl:2: 3 hash_ids but input_length 1024 allows at most 2"),
    (req(5, 10, [1, -2]), "trace.jsonl:2: 'hash_ids' must be a list of integers >= 0"),
    (req(5, 0, []), "trace.jsonl:2: 'input_length' must be an integer >= 1"),
    (req(5, 10, [1], n_out=-1), "trace.jsonl:2: 'output_length' must be an integer >= 0"),
    (req("soon", 10, [1]), "trace.jsonl:2: 'timestamp' must be a number"),
])
def test_bad_lines_are_named(tmp_path: Path, bad: object, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)):
        load_trace(write(tmp_path, [GOOD, bad]))


def test_timestamps_going_backwards_name_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, [req(0, 10, [1]), req(50, 10, [2]), "", req(40, 10, [3])])
    with pytest.raises(TraceError, match=r"trace.jsonl:4: timestamp 40 ms goes backwards \(line 2 has 50 ms\)"):
        load_trace(path)


def test_block_size_decides_what_is_too_long(tmp_path: Path) -> None:
    path = write(tmp_path, [req(0, 100, [1, 2, 3])])
    with pytest.raises(TraceError, match="allows at most 1"):
        load_trace(path)
    assert load_trace(path, block_size=40)[0].hash_ids == (1, 2, 3)


def test_missing_ids_become_fresh_unshared_blocks(tmp_path: Path) -> None:
    reqs = load_trace(write(tmp_path, [req(0, 1500, [7]), req(1, 1500, [7])]))
    assert reqs[0].hash_ids == (7, 8, 9) and reqs[1].hash_ids == (7, 10, 11)
    assert leading_seen(reqs) == [0, 1]


def test_ideal_counts_leading_ids_seen_before_capped_by_length(tmp_path: Path) -> None:
    reqs = load_trace(write(tmp_path, [
        req(0, 1000, [1, 2]),  # m = 0
        req(1, 1200, [1, 2, 3]),  # m = 2: 1024
        req(2, 300, [1]),  # m = 1: min(512, 300) = 300
        req(3, 1100, [4, 2, 3]),  # m = 0: 2 and 3 were seen, but not behind 4
    ]))
    assert leading_seen(reqs) == [0, 2, 1, 0]
    assert ideal_hit_rate(reqs) == pytest.approx((1024 + 300) / (1000 + 1200 + 300 + 1100))
    assert ideal_hit_rate(select(reqs, 1, 2)) == pytest.approx(300 / 1500)  # the slice starts cold
    with pytest.raises(TraceError, match="past the trace's 4 requests"):
        select(reqs, 9)


def test_gzipped_and_plain_read_the_same(tmp_path: Path) -> None:
    plain = write(tmp_path, [GOOD, req(1, 700, [1, 3])])
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    renamed = tmp_path / "gzipped-without-suffix.jsonl"  # the magic bytes decide, not the name
    renamed.write_bytes(packed.read_bytes())
    assert load_trace(packed) == load_trace(renamed) == load_trace(plain)


def test_mooncake_trace_in_the_repo() -> None:
    reqs = load_trace(MOONCAKE_TRACE)
    assert len(reqs) == 3993
    assert unique_blocks(reqs) == 43924
    assert round(ideal_hit_rate(reqs), 4) == 0.6512
