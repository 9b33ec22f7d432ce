"""OutputProcessor: deltas that add up to the whole output, stop strings split across tokens."""
from __future__ import annotations

from typing import Any

from kvstrata.engine.output_processor import OutputProcessor
from kvstrata.engine.request import Request, RequestStatus
from kvstrata.engine.sampling_params import SamplingParams

PIECES = {3: "he", 4: "llo", 5: " wo", 6: "rld", 7: "!", 8: " EN", 9: "D", 10: " more"}


class CharTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(PIECES[i] for i in ids)


def run(tokens: list[int], **params: Any) -> tuple[list[Any], str | None]:
    proc = OutputProcessor(CharTokenizer(), eos_token_ids=(2,), max_model_len=1000)  # type: ignore[arg-type]
    req = Request("r", [1, 1], SamplingParams(temperature=0.0, **params))
    proc.add(req)
    outs = []
    for tok in tokens:
        req.token_ids.append(tok)
        reason = proc.append_token(req, tok)
        if reason is not None:
            req.status, req.finish_reason = RequestStatus.FINISHED, reason
        outs.append(proc.output(req))
        if reason is not None:
            return outs, reason
    return outs, None


def test_deltas_add_up_and_carry_only_new_tokens() -> None:
    outs, reason = run([3, 4, 5, 6, 7], max_tokens=5)
    assert reason == "length"
    assert [o.new_token_ids for o in outs] == [[3], [4], [5], [6], [7]]
    assert "".join(o.new_text for o in outs) == "hello world!"


def test_stop_string_split_across_tokens_is_never_streamed() -> None:
    outs, reason = run([3, 4, 5, 6, 8, 9, 10], max_tokens=50, stop=["END"])
    assert reason == "stop"
    texts = [o.new_text for o in outs]
    assert "".join(texts) == "hello world "
    assert all("E" not in t for t in texts)  # the held-back "E" of " EN" never went out
    assert [len(o.new_token_ids) for o in outs] == [1] * 6 and outs[-1].finished


def test_stop_string_inside_one_token_and_holdback_release() -> None:
    outs, reason = run([3, 4, 5, 6, 7], max_tokens=50, stop=["wor"])
    assert reason == "stop" and "".join(o.new_text for o in outs) == "hello "
    outs, reason = run([3, 4, 5, 6, 7], max_tokens=5, stop=["xyzzy"])  # 4 chars held back while running
    assert reason == "length" and "".join(o.new_text for o in outs) == "hello world!"
    assert [o.new_text for o in outs] == ["", "h", "ell", "o w", "orld!"]
