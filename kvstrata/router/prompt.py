"""PromptHasher: a request body -> its prompt tokens and page hashes, exactly as a rank computes them.

Same tokenizer and chat template (`kvstrata.model.tokenizer.Tokenizer`), same rendering as the
rank (`tool_calls/plan.template_input`: developer -> system, the tools where the template or the
system message shows them; a /v1/responses or /v1/messages body becomes its chat request first), same hash chain
from the ranks' namespace root with the same extra key: the API key's tenant and the request's
`cache_salt` (`auth.tenant_extra_key`; without the tenant no authenticated request would ever
match), cut to the int64 block hashes that KV events carry. Only the pages a rank could match
count: (len(tokens) - 1) // page_size. A body the gateway cannot render (or a /v1/responses
turn whose history lives on a rank) is simply not matched; the rank answers it.
"""
from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any, NamedTuple

from pydantic import ValidationError

from kvstrata.kv.hashing import hash_pages, hash_to_int64
from kvstrata.model.tokenizer import Tokenizer
from kvstrata.serving.auth import tenant_extra_key
from kvstrata.serving.messages.request import MessagesRequest
from kvstrata.serving.messages.request import chat_body as messages_chat_body
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.responses.request import ResponsesRequest, chat_body
from kvstrata.serving.tool_calls.plan import template_input

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
    def __init__(self, tokenizer: Tokenizer, page_size: int, root: bytes, tool_call_parser: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.page_size = page_size
        self.root = root
        self.tool_call_parser = tool_call_parser  # the ranks' --tool-call-parser
        self.encode = SegmentEncoder(tokenizer)

    @classmethod
    def load(cls, model: str, page_size: int, root: bytes, tool_call_parser: str = "auto") -> PromptHasher:
        from kvstrata.model.fetch import resolve_model

        return cls(Tokenizer.from_path(resolve_model(model)), page_size, root, tool_call_parser)

    def _chat_tokens(self, req: ChatCompletionRequest) -> list[int]:
        messages, tools = template_input(req, self.tokenizer, self.tool_call_parser)
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools,
                                                  **req.template_kwargs())
        return self.encode(text)

    def tokens(self, path: str, body: dict[str, Any]) -> list[int] | None:
        try:
            if path.endswith("/chat/completions"):
                return self._chat_tokens(ChatCompletionRequest.model_validate(body))
            if path.endswith("/v1/messages"):
                return self._chat_tokens(ChatCompletionRequest.model_validate(
                    messages_chat_body(MessagesRequest.model_validate(body), None)[0]))
            if path.endswith("/responses"):
                req = ResponsesRequest.model_validate(body)
                if req.previous_response_id is not None:
                    return None  # its history is on the rank that stored it (the gateway routes there)
                return self._chat_tokens(ChatCompletionRequest.model_validate(chat_body(req, [])[0]))
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

    def prompt(self, path: str, body: dict[str, Any], tenant: str | None = None) -> Prompt | None:
        """The prompt's size and page hashes; `tenant`: the API key's (None when keys are off)."""
        tokens = self.tokens(path, body)
        if not tokens:
            return None
        salt = body.get("cache_salt")
        extra = tenant_extra_key(tenant, salt if isinstance(salt, str) else None)
        n = (len(tokens) - 1) // self.page_size * self.page_size
        hashes = hash_pages(tokens[:n], self.page_size, self.root, extra)
        return Prompt(len(tokens), [hash_to_int64(h) for h in hashes])
