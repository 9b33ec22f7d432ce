"""The raw-body checks (kvstrata/serving/body_scan.py): right answers on tricky escapes, and linear
cost on the bodies that made the old string regex quadratic."""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.serving.body_scan import has_lone_surrogate, has_non_finite, json_depth, non_finite_key, scan_body


def test_depth_ignores_brackets_in_strings_and_escapes() -> None:
    assert json_depth(b'{"a": "[[[[{{{{", "b": [1, {"c": [2]}]}') == 4
    assert json_depth(b'{"a": "\\"[[["}') == 1
    assert json_depth(b'{"a": "\\\\", "b": [[["x"]]]}') == 4  # `\\` is one escape: the quote after it closes
    assert json_depth(b"[" * 50) == 50  # unclosed brackets count as open
    assert json_depth(b"") == 0


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(), kids, max_size=3),
                    max_leaves=20))
def test_depth_matches_the_parsed_value(value: object) -> None:
    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        return 0

    for ascii_only in (True, False):
        body = json.dumps(value, ensure_ascii=ascii_only).encode()
        assert scan_body(body) == (depth(value), False, False)


@pytest.mark.parametrize("text, lone", [
    (b'"\\ud83d\\ude00"', False),  # a pair
    (b'"\\ud800"', True),
    (b'"\\udc00"', True),  # a low half alone
    (b'"\\ud800\\n\\udc00"', True),  # something between the halves
    (b'"\\ud800\\ud800\\udc00"', True),
    (b'"\\\\ud800"', False),  # an escaped backslash, then plain text
    (b'"\\\\\\ud800"', True),  # an escaped backslash, then a lone escape
    (b'"\\u0041\\uD83D\\uDE00"', False),
    ('"\U0001F600"'.encode(), False),
    (b'"\xed\xa0\x80"', True),  # the UTF-8 bytes of U+D800 (Python's json reads them as "\ud800")
])
def test_lone_surrogates(text: bytes, lone: bool) -> None:
    assert has_lone_surrogate(b'{"content": ' + text + b"}") is lone


def test_non_finite_literals_outside_strings_only() -> None:
    assert has_non_finite(b'{"text": {"x": NaN}}') and has_non_finite(b'{"t": -Infinity}')
    assert not has_non_finite(b'{"content": "NaN and Infinity are words here", "n": 1e308}')
    assert not has_non_finite(b'{"a": "\\"NaN"}')


def test_hostile_bodies_cost_linear_time() -> None:
    """1 MiB of an unterminated string of escaped quotes: the old regex rescanned to the end from
    every quote (16 KB took 2.8 s, growing with the square: hours at 1 MiB); linear passes take
    milliseconds. The bound is ~1000x what they take, and far below what a quadratic scan needs."""
    n = 1 << 20
    bodies = [
        b'{"prompt": "' + b'"' + b'\\"' * (n // 2),  # the body, scaled up
        b'{"prompt": "' + b"\\" * n,  # one long run of escapes
        b'"' * n,  # every byte a quote
        b"[" * n,  # every byte a bracket
        b'{"a": "' + b"\\ud800\\u0041" * (n // 12) + b'"}',  # many surrogate escapes
    ]
    for body in bodies:
        started = time.perf_counter()
        json_depth(body), has_lone_surrogate(body), has_non_finite(body)
        assert time.perf_counter() - started < 20.0, body[:40]


@pytest.mark.parametrize("body, key", [
    (b'{"prompt": "hi", "max_tokens": NaN}', "max_tokens"),
    (b'{"prompt": "NaN", "temperature" : -Infinity}', "temperature"),
    (b'{"input": "x", "text": {"format": {"type": "text"}, "x": NaN}}', "x"),
    (b'{"stop": [1, NaN]}', None),  # not right after a key: no param
])
def test_the_non_finite_literal_is_named_by_its_key(body: bytes, key: str | None) -> None:
    assert has_non_finite(body) and non_finite_key(body) == key
