"""Tokenizer: token ids, decoding and chat templates identical to transformers' for the same GGUF."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvstrata.model import tokenizer as tokenizer_module
from kvstrata.model.chat_template import ChatTemplate, ChatTemplateError
from kvstrata.model.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

TEXTS = [
    "Hello, world! How are you today?",
    "Ünïcödé: café, naïve, Straße, São Paulo, Ελληνικά, русский",
    "日本語のテキストと中文文本，还有한국어",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵 done",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "spaces    and\ttabs\t\tand\n\n\nnewlines   \n  trailing   ",
    "numbers 12345 and 3.14159 and 2024-11-30, price $1,234.56",
    "<|im_start|>user\nspecial tokens inline<|im_end|>\n<|endoftext|>",
    "   leading spaces, {\"json\": [1, 2, {\"k\": null}]}",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Arr, hello matey."},
        {"role": "user", "content": "Tell me a joke 😀 about 日本"},
    ],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
]


@pytest.fixture(scope="module")
def cold_and_cached(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, list[int]]:
    """Cold load into an empty model home, then a cached load; how many GGUF conversions had run after each."""
    home = tmp_path_factory.mktemp("kvstrata-home")
    conversions: list[int] = []
    converted = 0

    def counting_convert(path: Path) -> Any:
        nonlocal converted
        converted += 1
        return convert(path)

    convert = tokenizer_module._convert_gguf_tokenizer
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSTRATA_HOME", str(home))
        mp.setattr(tokenizer_module, "_convert_gguf_tokenizer", counting_convert)
        start = time.perf_counter()
        Tokenizer.from_path(smollm2_path)
        cold = time.perf_counter() - start
        conversions.append(converted)
        assert len(list((home / "tokenizers").glob("*.json"))) == 1
        start = time.perf_counter()
        cached = Tokenizer.from_path(smollm2_path)
        conversions.append(converted)
        warm = time.perf_counter() - start
    logger.info("event=tokenizer_timing cold_s=%.3f cached_s=%.3f", cold, warm)  # for the log, not asserted
    return cached, conversions


@pytest.fixture(scope="module")
def tok(cold_and_cached: tuple[Tokenizer, list[int]]) -> Tokenizer:
    return cold_and_cached[0]  # the cached load: every test below checks it against transformers


def test_cached_load_reads_the_cache_instead_of_converting(cold_and_cached: tuple[Tokenizer, list[int]]) -> None:
    _, conversions = cold_and_cached
    assert conversions == [1, 1]  # the cold load converted the GGUF's tokenizer once, the cached one did not


def test_special_tokens(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1
    assert tok.eos_token_ids == (2,)  # <|im_end|>: both the eos and the template's end of turn
    assert tok.decode([2], skip_special_tokens=False) == "<|im_end|>"


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok: Tokenizer, hf_tokenizer: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=True) == hf_tokenizer.encode(text)
    assert tok.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids, skip_special_tokens=False)
    if "<|" not in text:
        assert tok.decode(ids) == text


def test_known_ids(tok: Tokenizer) -> None:
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.encode("<|im_start|>user") == [1, 4093]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_transformers(tok: Tokenizer, hf_tokenizer: Any, messages: list[dict]) -> None:
    for add_generation_prompt in (True, False):
        ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        ref = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours == ref
    prompt = tok.apply_chat_template(messages)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tok.encode(prompt) == hf_tokenizer.encode(prompt, add_special_tokens=False)
    assert tok.encode(prompt)[0] == 1  # <|im_start|> stays one token


def test_content_parts_are_joined(tok: Tokenizer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]
    plain = [{"role": "user", "content": "first\nsecond"}]
    assert tok.apply_chat_template(parts) == tok.apply_chat_template(plain)
    with pytest.raises(ChatTemplateError, match="image_url"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_folder_tokenizer_matches_gguf(hf_folder: Path, tok: Tokenizer) -> None:
    folder_tok = Tokenizer.from_path(hf_folder)
    assert (folder_tok.vocab_size, folder_tok.bos_token_id, folder_tok.eos_token_ids) == (49152, 1, (2,))
    for text in TEXTS:
        assert folder_tok.encode(text) == tok.encode(text)
    for messages in CONVERSATIONS:
        assert folder_tok.apply_chat_template(messages) == tok.apply_chat_template(messages)


TOOL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}"
    "  {% if m.role not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('bad role ' + m.role) }}{% endif %}\n"
    "<{{ m.role }}{% if m.name %} name={{ m.name }}{% endif %}>{{ m.content }}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson(indent=2) }}{% endif %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_custom_template_tools_and_passthrough(tok: Tokenizer, hf_tokenizer: Any) -> None:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für <Ort> & Zeit",
                                               "parameters": parameters}}]
    call = {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}
    messages = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": "18°C"},
    ]
    template = ChatTemplate(TOOL_TEMPLATE, tok.special_tokens)
    ours = template.render(messages, add_generation_prompt=True, tools=tools)
    ref = hf_tokenizer.apply_chat_template(messages, tools=tools, chat_template=TOOL_TEMPLATE, tokenize=False,
                                           add_generation_prompt=True)
    assert ours == ref
    assert "Wetter für <Ort> & Zeit" in ours and "[call_1]" in ours  # tojson does not HTML-escape
    with pytest.raises(ChatTemplateError, match="bad role robot"):
        template.render([{"role": "robot", "content": "beep"}])


def test_missing_tokenizer_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_path(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_path(tmp_path / "missing.gguf")


def test_encoding_a_long_text_lets_other_threads_run(tok: Tokenizer) -> None:
    """The server encodes in worker threads: a long prompt must leave the event loop's thread free (the
    tokenizer's single-text `encode` holds the GIL for the whole call; ours releases it)."""
    text = "the quick brown fox jumps over the lazy dog. " * 12000  # ~0.5 MB: a few hundred ms of encoding
    done = threading.Event()
    worker = threading.Thread(target=lambda: (tok.encode(text), done.set()))
    ticks = 0
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        ticks += 1
    worker.join()
    assert ticks > 20  # with the GIL held throughout, the loop above gets one turn
    assert tok.encode(text[:200]) == tok.backend.encode(text[:200]).ids
