"""The tokens a chat template writes between a reply and the next message: what the engine prefills after a
reply while the client works (engine/next_turn.py).

Found once per tokenizer by rendering a probe conversation (user, assistant, user) and taking the text
between the reply's text and the next user text: ChatML's `<|im_end|>\n<|im_start|>user\n`. It is used only
where it is safe to predict:
- it starts with a token generation stops on (the engine follows a reply that ended on exactly that token);
- it tokenizes to the same ids inside the whole conversation as alone (no merge across its edges), so the
  follow-up's tokens are those the next turn's prompt will hold.
Where a template fails either test (or cannot render the probe) the opener is empty and nothing is
prefilled. A wrong guess could only cost a background step: the prefix cache matches tokens, so tokens
that differ are simply not hit.
"""
from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstrata.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_USER, _REPLY, _NEXT = "What is two plus two?", "Four.", "And three plus three?"
_FOUND: weakref.WeakKeyDictionary[Tokenizer, tuple[int, ...]] = weakref.WeakKeyDictionary()


def turn_opener(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The reply's turn end and the next user message's opening, as ids; () where the template does not
    give one safely."""
    found = _FOUND.get(tokenizer)
    if found is None:
        found = _FOUND[tokenizer] = _derive(tokenizer)
        log.info("event=turn_opener tokens=%d", len(found))
    return found


def _derive(tokenizer: Tokenizer) -> tuple[int, ...]:
    messages = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _REPLY},
                {"role": "user", "content": _NEXT}]
    if tokenizer.chat_template is None:
        return ()
    try:
        text = tokenizer.chat_template.render(messages, add_generation_prompt=False, tools=None)
    except Exception:  # a template that cannot render the probe: nothing to predict
        return ()
    end = text.find(_REPLY, text.find(_USER) + len(_USER)) + len(_REPLY)
    start = text.find(_NEXT, end)
    if end < len(_REPLY) or start <= end:
        return ()
    head, gap = text[:end], text[end:start]
    ids = tokenizer.encode(gap)
    if not ids or ids[0] not in tokenizer.eos_token_ids:
        return ()
    if tokenizer.encode(head + gap + _NEXT) != tokenizer.encode(head) + ids + tokenizer.encode(_NEXT):
        return ()
    return tuple(ids)
