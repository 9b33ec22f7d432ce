"""Model-package fixtures: the transformers reference for the real SmolLM2 GGUF, loaded once.

The reference model takes ~15 s to load, so it and what is derived from it (a safetensors
folder) are session-scoped. `smollm2_path` comes from tests/conftest.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def hf_model(smollm2_path: Path) -> Any:
    """transformers' own load of the GGUF (dequantized to float32): the reference for our loader."""
    try:
        import accelerate  # noqa: F401  (transformers refuses GGUF loading without it)
    except ImportError:
        pytest.fail("transformers needs `accelerate` to load a GGUF: pip install accelerate (dev extra)")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
    return model.eval()


@pytest.fixture(scope="session")
def hf_state_dict(hf_model: Any) -> dict[str, Any]:
    return {name: t.detach() for name, t in hf_model.state_dict().items()}


@pytest.fixture(scope="session")
def hf_tokenizer(smollm2_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory: pytest.TempPathFactory, hf_model: Any, hf_tokenizer: Any) -> Path:
    """The reference model and tokenizer saved as a Hugging Face safetensors folder."""
    out = tmp_path_factory.mktemp("smollm2-hf")
    hf_model.hf_quantizer.remove_quantization_config(hf_model)  # else save_pretrained refuses
    hf_model.save_pretrained(out)
    hf_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path: Path) -> Any:
    """Our tokenizer for the real GGUF (uses the converted-tokenizer cache in the model home)."""
    from kvstrata.model.tokenizer import Tokenizer

    return Tokenizer.from_path(smollm2_path)
