"""`Tokenizer`: a fast `tokenizers` tokenizer plus the model's chat template and stop tokens.

From a HF folder it reads tokenizer.json directly. A GGUF carries only vocab and merges, so the
first start converts them with transformers' GGUF converter (seconds) and saves the result as
`<model_home>/tokenizers/<gguf identity>-tf<transformers version>.json`; later starts load that
file with `tokenizers.Tokenizer.from_file` (tenths of a second). The key changes when the file or
the converter does, so a stale conversion is never used.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from kvstrata.model.chat_template import ChatTemplate
from kvstrata.model.fetch import model_home
from kvstrata.model.gguf_header import GGUFHeader, gguf_identity, read_gguf_header
from kvstrata.model.token_segments import SegmentCache

logger = logging.getLogger(__name__)

# End-of-turn markers of common chat formats; one the template writes also stops generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|return|>")
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class Tokenizer:
    def __init__(
        self,
        backend: Any,  # tokenizers.Tokenizer
        chat_template: str | None,
        special_tokens: dict[str, str | None],
        extra_eos_ids: tuple[int, ...] = (),
    ) -> None:
        self.backend = backend
        self.special_tokens = special_tokens
        self.chat_template = ChatTemplate(chat_template, special_tokens) if chat_template else None
        self._bos_token_id = self.token_to_id(special_tokens.get("bos_token"))
        eos = [self.token_to_id(special_tokens.get("eos_token")), *extra_eos_ids]
        if chat_template:
            eos += [self.token_to_id(t) for t in END_OF_TURN_TOKENS if t in chat_template]
        self._eos_token_ids = tuple(dict.fromkeys(i for i in eos if i is not None))
        self._texts: dict[int, str] = {}  # token_text's, filled as logprobs name tokens (at most the vocabulary)
        self._segments = SegmentCache(backend)

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer:
        """Load from a .gguf file or a HF folder holding tokenizer.json."""
        path = Path(path).expanduser()
        start = time.perf_counter()
        if path.is_dir():
            tokenizer = _from_folder(path)
        elif path.is_file():
            tokenizer = _from_gguf(path)
        else:
            raise FileNotFoundError(f"tokenizer path {path} does not exist; pass a .gguf file or a HF model folder.")
        logger.info("event=tokenizer_loaded path=%s seconds=%.3f", path, time.perf_counter() - start)
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: the eos token, the config's extra ones, the template's end-of-turn."""
        return self._eos_token_ids

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The text's ids. Through `encode_batch`, which releases the GIL while it works (`encode` holds it for
        the whole call): the server tokenizes in worker threads, and a long prompt must not stop the event
        loop that carries every stream meanwhile. A long text without added special tokens at its ends is
        tokenized between its special tokens, the pieces an agent resends from a cache (token_segments.py)."""
        ids = None if add_special_tokens else self._segments.encode(text)
        return ids if ids is not None else self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token's own text, special tokens included (logprobs name tokens by it); decoded once a token."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.decode([token_id], skip_special_tokens=False)
        return text

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for an OpenAI-style conversation."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; use the completions API with a plain prompt.")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)


def _from_gguf(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    header = read_gguf_header(path)
    cache_file = _gguf_tokenizer_cache(header)
    if cache_file.is_file():
        backend = Backend.from_file(str(cache_file))
    else:
        backend = _convert_gguf_tokenizer(path)
        _atomic_write(cache_file, backend.to_str())
        logger.info("event=tokenizer_cached path=%s", cache_file)
    special = {
        name: _token_of(backend, header, f"tokenizer.ggml.{key}")
        for name, key in zip(_SPECIAL_NAMES, ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"))
    }
    extra_keys = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    extra = tuple(header.metadata[k] for k in extra_keys if k in header.metadata)
    return Tokenizer(backend, header.metadata.get("tokenizer.chat_template"), special, extra)


def _gguf_tokenizer_cache(header: GGUFHeader) -> Path:
    return model_home() / "tokenizers" / f"{gguf_identity(header)}-tf{version('transformers')}.json"


def tokenizer_json(model_path: str | Path) -> Path | None:
    """The tokenizer.json other programs can load for this model: a HF folder's own, or the one a
    GGUF's tokenizer was converted to (written by the first `Tokenizer.from_path`); None if absent."""
    path = Path(model_path).expanduser()
    found = path / "tokenizer.json" if path.is_dir() else _gguf_tokenizer_cache(read_gguf_header(path))
    return found if found.is_file() else None


def _convert_gguf_tokenizer(path: Path) -> Any:
    """Build the fast tokenizer with transformers' GGUF converter (slow: seconds)."""
    from transformers import AutoTokenizer

    start = time.perf_counter()
    path = path.expanduser().resolve()  # gguf_file is taken relative to the folder: pass the bare name
    hf_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    logger.info("event=tokenizer_converted path=%s seconds=%.2f", path, time.perf_counter() - start)
    return hf_tokenizer.backend_tokenizer


def _token_of(backend: Any, header: GGUFHeader, key: str) -> str | None:
    token_id = header.metadata.get(key)
    return None if token_id is None else backend.id_to_token(int(token_id))


def _from_folder(folder: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise FileNotFoundError(
            f"{folder} has no tokenizer.json; save the fast tokenizer there "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(folder))."
        )
    backend = Backend.from_file(str(tokenizer_file))
    config = _read_json(folder / "tokenizer_config.json")
    special_map = _read_json(folder / "special_tokens_map.json")
    special = {name: _token_text(config.get(name, special_map.get(name))) for name in _SPECIAL_NAMES}
    extra: list[int] = []
    for name in ("generation_config.json", "config.json"):
        eos = _read_json(folder / name).get("eos_token_id")
        extra += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return Tokenizer(backend, _folder_chat_template(folder, config), special, tuple(int(i) for i in extra))


def _folder_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template") or _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def _token_text(value: Any) -> str | None:
    """tokenizer_config writes special tokens as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
