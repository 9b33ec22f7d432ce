"""Requests validated by protocol.py, checked against the loaded model: engine inputs.

`prepare_chat` renders the chat template and tokenizes, `prepare_completion` tokenizes each
prompt; both check the model name, prompt lengths and ids, and clamp max_tokens to the room
left in the context (see protocol.py's docstring for the rules). `prepare_chat` also resolves how
the reply's reasoning is split off (`reply_reasoning`: `--reasoning-parser` and the request's thinking).
`render_chat` is the template rendering alone, which /tokenize (tokenize_api.py) shares.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvstrata.engine.sampling_params import InvalidRequestError, SamplingParams
from kvstrata.serving.errors import APIError, quote
from kvstrata.serving.protocol import COMPLETIONS_DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest
from kvstrata.serving.reasoning import resolve_reasoning_parser
from kvstrata.serving.sampling_request import SamplingRequest
from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.plan import ToolPlan, plan_tools
from kvstrata.serving.tool_calls.validate import forced_tool, response_schema
from kvstrata.serving.turn_opener import turn_opener

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine
    from kvstrata.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class PreparedRequest:
    """Engine inputs for one HTTP request: each prompt gets `params.n` choices."""

    prompts: list[list[int]]
    params: SamplingParams
    timeout_s: float | None = None  # the request's `timeout`: abort and answer 408 past it
    tool_format: ToolCallFormat | None = None  # chat with tools: replies are parsed for tool calls
    reasoning: str | None = None  # chat: the reasoning parser replies are split with (None: all content)
    echo: list[tuple[str, list[int]]] | None = None  # completions' echo: each prompt's text and tokens


def check_model(model: str | None, engine: AsyncEngine) -> None:
    """404 model_not_found unless `model` is the served model (None means the served model)."""
    if model is not None and model != engine.served_model_name:
        msg = f"The model {quote(model)} does not exist; this server serves `{engine.served_model_name}`"
        raise APIError(404, msg, param="model", code="model_not_found")


def _finish(
    req: SamplingRequest, engine: AsyncEngine, prompts: list[list[int]], max_tokens: int | None, default: int | None
) -> PreparedRequest:
    """Check prompt lengths/ids and parameters, clamp max_tokens to the room left in the context."""
    limit, vocab = engine.max_model_len, engine.vocab_size
    for ids in prompts:
        if not ids:
            raise InvalidRequestError("the prompt is empty; send at least one token", "prompt")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            msg = f"prompt token ids {bad[:8]} are outside the vocabulary [0, {vocab})"
            raise InvalidRequestError(msg, "prompt")
        if len(ids) >= limit:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens but the model's maximum context is {limit} tokens "
                f"(including at least 1 generated token); shorten the prompt",
                "messages" if isinstance(req, ChatCompletionRequest) else "prompt", "context_length_exceeded",
            )
    if max_tokens is not None and max_tokens >= limit:
        name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
        raise InvalidRequestError(
            f"{name} is too large: {max_tokens}; the model's context is {limit} tokens, prompt included, so at "
            f"most {limit - 1} can be generated", name, "context_length_exceeded",
        )
    room = limit - max(len(ids) for ids in prompts)
    wanted = max_tokens if max_tokens is not None else (default or room)
    params = req.sampling_params(min(wanted, room))
    sched = engine.sched_cfg
    params.validate(vocab, max_n=sched.max_n, max_stop=sched.max_stop_strings)
    if len(prompts) * params.n > sched.max_num_seqs:
        msg = f"{len(prompts)} prompts x n={params.n} is more than the {sched.max_num_seqs} sequences at once"
        raise InvalidRequestError(msg + "; split the batch", "prompt")
    for ids in prompts:
        params = engine.check_prompt(ids, params)
    return PreparedRequest(prompts, params, req.timeout)


def reply_reasoning(req: ChatCompletionRequest, tokenizer: Tokenizer, reasoning_parser: str,
                    constrained: bool | None = None) -> str | None:
    """The reasoning parser of this request's replies: None when thinking is off, the template has none,
    or the reply is `constrained` (a forced call, a response_format schema: the grammar holds from its
    first token, so the whole reply is content; None: read from the request, planned before)."""
    if constrained is None:
        constrained = bool(forced_tool(req.tool_choice, req.tools)) or response_schema(req.response_format) is not None
    if not req.thinking or constrained:
        return None
    template = tokenizer.chat_template
    return resolve_reasoning_parser(reasoning_parser, template.source if template is not None else None)


def render_chat(
    req: ChatCompletionRequest, tokenizer: Tokenizer, tool_call_parser: str, add_generation_prompt: bool = True
) -> tuple[ToolPlan, str]:
    """The request's checked tool plan and the prompt text its messages render to (400s naming the field)."""
    plan = plan_tools(req, tokenizer, tool_call_parser)
    try:
        text = tokenizer.apply_chat_template(plan.messages, add_generation_prompt=add_generation_prompt,
                                             tools=plan.template_tools, **req.template_kwargs())
    except Exception as exc:  # a template's raise_exception(...) or a message it cannot render
        msg = f"the chat template could not render these messages: {exc}"
        raise InvalidRequestError(msg, "messages") from exc
    return plan, text


def prepare_chat(
    req: ChatCompletionRequest, engine: AsyncEngine, tool_call_parser: str = "auto", reasoning_parser: str = "auto"
) -> PreparedRequest:
    check_model(req.model, engine)
    req.refuse_unsupported()
    plan, text = render_chat(req, engine.tokenizer, tool_call_parser)
    prompt = engine.tokenizer.encode(text)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    prepared = _finish(req, engine, [prompt], max_tokens, None)
    # one reply: its turn end and the next message's opening are prefilled after it (serving/turn_opener.py)
    opener = turn_opener(engine.tokenizer) if prepared.params.n == 1 else ()
    return replace(prepared, params=replace(prepared.params, grammar=plan.grammar, next_turn=opener),
                   tool_format=plan.tool_format,
                   reasoning=reply_reasoning(req, engine.tokenizer, reasoning_parser, plan.constrained))


def prepare_completion(req: CompletionRequest, engine: AsyncEngine) -> PreparedRequest:
    check_model(req.model, engine)
    req.refuse_unsupported()
    raw = req.prompt
    items: list[Any] = [raw] if isinstance(raw, str) or (raw and type(raw[0]) is int) else list(raw)
    prompts = [engine.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in items]
    prepared = _finish(req, engine, prompts, req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)
    if not req.echo:
        return prepared
    texts = [p if isinstance(p, str) else engine.tokenizer.decode(ids, skip_special_tokens=False)
             for p, ids in zip(items, prompts)]
    return replace(prepared, echo=list(zip(texts, prompts)))

