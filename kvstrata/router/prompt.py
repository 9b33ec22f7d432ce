"""PromptHasher: a request body -> its prompt tokens and page hashes, exactly as a rank computes them.

Same tokenizer and chat template (`kvstrata.model.tokenizer.Tokenizer`), same rendering as
`serving/protocol.py` (developer -> system, tools unless tool_choice is "none"), same hash chain
from the ranks' namespace root with the request's `cache_salt`, cut to the int64 block hashes
that KV events carry. Only the pages a rank could match count: (len(tokens) - 1) // page_size.
A body the gateway cannot render is simply not matched; the rank answers it (with its 400).
"""
from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any, NamedTuple

from pydantic import ValidationError

from kvstrata.kv.hashing import hash_pages, hash_to_int64
from kvstrata.model.tokenizer import Tokenizer
from kvstrata.serving.protocol import ChatCompletionRequest

logger = logging.getLogger(__name__)


class SegmentEncoder:
    """`tokenizer.encode(text)`, memoized per stretch of text between added tokens.

    The performance trick: an agent re-sends its whole history every turn, and the system prompt
    and every earlier message come back unchanged between the template's special tokens. The
    tokenizer splits on added tokens before anything else, so encoding each stretch alone gives
    the same ids; remembered stretches cost a dict lookup (a 2k-token agentic prompt: ~4 ms of
    encoding becomes ~0.3 ms). Tokenizers with added tokens that strip or normalize their
    neighbours get no memo: exactness first.
    """

    MAX_SEGMENTS = 1024

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        added = list(tokenizer.backend.get_added_tokens_decoder().values())
        plain = all(not (a.lstrip or a.rstrip or a.single_word or a.normalized) for a in added)
        contents = sorted({a.content for a in added}, key=len, reverse=True)  # leftmost-longest, as tokenizers
        self._split = re.compile("(" + "|".join(map(re.escape, contents)) + ")") if plain and contents else None
        self._memo: OrderedDict[str, list[int]] = OrderedDict()

    def __call__(self, text: str) -> list[int]:
        if self._split is None:
            return self.tokenizer.encode(text)
        ids: list[int] = []
        for part in self._split.split(text):
            if not part:
                continue
            cached = self._memo.get(part)
            if cached is None:
                cached = self._memo[part] = self.tokenizer.encode(part)
                if len(self._memo) > self.MAX_SEGMENTS:
                    self._memo.popitem(last=False)
            else:
                self._memo.move_to_end(part)
            ids.extend(cached)
        return ids


class Prompt(NamedTuple):
    num_tokens: int
    hashes: list[int]  # int64 block hashes of the matchable full pages


class PromptHasher:
    def __init__(self, tokenizer: Tokenizer, page_size: int, root: bytes) -> None:
        self.tokenizer = tokenizer
        self.page_size = page_size
        self.root = root
        self.encode = SegmentEncoder(tokenizer)

    @classmethod
    def load(cls, model: str, page_size: int, root: bytes) -> PromptHasher:
        from kvstrata.model.fetch import resolve_model

        return cls(Tokenizer.from_path(resolve_model(model)), page_size, root)

    def tokens(self, path: str, body: dict[str, Any]) -> list[int] | None:
        try:
            if path.endswith("/chat/completions"):
                req = ChatCompletionRequest.model_validate(body)
                tools = None if req.tool_choice == "none" else req.tools
                text = self.tokenizer.apply_chat_template(
                    [m.for_template() for m in req.messages], add_generation_prompt=True, tools=tools
                )
                return self.encode(text)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]  # a batch: route by its first prompt
            if isinstance(prompt, str):
                return self.encode(prompt)
            if isinstance(prompt, list) and all(type(t) is int and t >= 0 for t in prompt):
                return prompt
        except (ValidationError, ValueError, TypeError) as exc:
            logger.debug("router_prompt_unrendered error=%s", exc)
        except Exception as exc:  # a template's raise_exception(): the rank will say why
            logger.debug("router_prompt_unrendered error=%r", exc)
        return None

    def prompt(self, path: str, body: dict[str, Any]) -> Prompt | None:
        tokens = self.tokens(path, body)
        if not tokens:
            return None
        salt = body.get("cache_salt")
        n = (len(tokens) - 1) // self.page_size * self.page_size
        hashes = hash_pages(tokens[:n], self.page_size, self.root, salt if isinstance(salt, str) else None)
        return Prompt(len(tokens), [hash_to_int64(h) for h in hashes])
