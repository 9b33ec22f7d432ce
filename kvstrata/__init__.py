"""kvstrata: an LLM inference server that never computes a prompt prefix twice."""
from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:  # lazy: `import kvstrata` stays light for the CLI
    if name == "LLM":
        from kvstrata.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kvstrata.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
