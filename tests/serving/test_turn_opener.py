"""The tokens a chat template writes between a reply and the next user message (serving/turn_opener.py)."""
from __future__ import annotations

from pathlib import Path

from kvstrata.model.tokenizer import Tokenizer
from kvstrata.serving.turn_opener import turn_opener


def with_template(base: Tokenizer, template: str | None) -> Tokenizer:
    return Tokenizer(base.backend, template, base.special_tokens)


def test_chatml_opener_is_the_turn_end_and_the_next_user_header(smollm2_path: Path) -> None:
    tok = Tokenizer.from_path(smollm2_path)
    opener = turn_opener(tok)
    assert opener == tuple(tok.encode("<|im_end|>\n<|im_start|>user\n"))
    assert opener[0] in tok.eos_token_ids and len(opener) == 5
    assert turn_opener(tok) is opener  # found once a tokenizer


def test_no_opener_where_the_template_cannot_say(smollm2_path: Path) -> None:
    base = Tokenizer.from_path(smollm2_path)
    assert turn_opener(with_template(base, None)) == ()  # no template
    # a turn end generation does not stop on: the engine could not tell the reply ended there
    plain = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    assert turn_opener(with_template(base, plain)) == ()
    # a template that refuses the probe's shape
    strict = "{{ raise_exception('system message required') }}"
    assert turn_opener(with_template(base, strict)) == ()
    # the opener's last token would merge with the next message's text: not predictable
    merging = "{% for m in messages %}<|im_start|>{{ m.role }}\n {{ m.content }}<|im_end|>\n{% endfor %}"
    assert turn_opener(with_template(base, merging)) == ()  # ` ` + `And`: one token in the whole prompt
