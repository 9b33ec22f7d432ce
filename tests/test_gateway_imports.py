"""What the gateway process loads: `kvstrata route` and `kvstrata serve --dp-size N` import no engine, no
model forward, no torch and no rank-side serving module (metrics, state, routes).

tests/test_imports.py checks each import against the package order; this checks what a chain of
allowed imports pulls in (router -> serving -> metrics -> engine is allowed link by link, and still
puts the engine in the gateway). The gateway shares with ranks only what it needs to read a request
as a rank does: request validation (`InvalidRequestError` and the output types of engine's two light
modules) and the tokenizer side of `model/` (it hashes prompts into pages for cache-aware routing)."""
from __future__ import annotations

import json
import subprocess
import sys

# what the gateway process imports: the CLI, the gateway app, the launcher of --dp-size ranks
GATEWAY_ENTRY = ("kvstrata.cli", "kvstrata.router.app", "kvstrata.router.launcher")
SHARED_WITH_RANKS = {
    "kvstrata.engine", "kvstrata.engine.sampling_params", "kvstrata.engine.outputs",
    "kvstrata.model", "kvstrata.model.tokenizer", "kvstrata.model.token_segments", "kvstrata.model.chat_template",
    "kvstrata.model.fetch",
    "kvstrata.model.file_digest", "kvstrata.model.gguf_header", "kvstrata.model.logprobs", "kvstrata.model.cpu_caps",
}
RANK_SIDE_SERVING = {"kvstrata.metrics.rank", "kvstrata.serving.state", "kvstrata.serving.server", "kvstrata.serving.openai_api"}


def loaded_by(modules: tuple[str, ...]) -> set[str]:
    """The modules a fresh interpreter holds after importing `modules`."""
    code = f"import importlib, json, sys; [importlib.import_module(m) for m in {list(modules)!r}]; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(out.stdout))


def rank_side(loaded: set[str]) -> list[str]:
    """The modules of `loaded` that belong to a rank, not to the gateway."""
    return sorted(
        m for m in loaded
        if m == "torch"
        or m in RANK_SIDE_SERVING
        or (m.startswith(("kvstrata.engine", "kvstrata.model")) and m not in SHARED_WITH_RANKS)
    )


def test_the_gateway_loads_no_rank_module() -> None:
    loaded = loaded_by(GATEWAY_ENTRY)
    assert "kvstrata.router.gateway" in loaded
    assert rank_side(loaded) == []


def test_a_rank_loads_them() -> None:
    """The check sees a slip: the rank's server module pulls in what the gateway must not."""
    slips = rank_side(loaded_by(("kvstrata.serving.server", "kvstrata.engine.engine")))
    assert {"kvstrata.metrics.rank", "kvstrata.serving.state", "kvstrata.engine.engine", "torch"} <= set(slips)
