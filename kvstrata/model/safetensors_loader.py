"""Load a Hugging Face folder (config.json + *.safetensors, optionally sharded) as float32 tensors.

Tensor names are already Hugging Face's; this keeps the ones the architecture uses, drops
extras (rotary `inv_freq` buffers, a tied `lm_head.weight` saved anyway) and upcasts to float32. An MoE
checkpoint's one tensor an expert (`mlp.experts.{e}.gate_proj.weight`) is copied into its slot of one
stacked tensor a layer and projection (`mlp.experts.gate_proj.weight`, [experts, out, in]), the form a
GGUF holds them in (moe.py takes a view an expert).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.file_digest import file_sha256
from kvstrata.model.gguf_header import safe_stem

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+_proj\.weight)$")  # stack, expert, part


def read_hf_config(folder: Path) -> dict:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{folder} has no config.json; pass a Hugging Face model folder "
            "(config.json + *.safetensors) or a .gguf file."
        )
    return json.loads(config_path.read_text(encoding="utf-8"))


def shard_files(folder: Path) -> list[Path]:
    """The safetensors files of `folder`, from the shard index when there is one."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: shards {missing} named in {INDEX_FILE} are missing; re-download them.")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors files; convert the checkpoint to safetensors.")
    return files


def load_folder(
    folder: Path, expected_names: Callable[[ModelArch], Collection[str]]
) -> tuple[ModelArch, dict[str, torch.Tensor], str]:
    """(arch, float32 tensors by HF name, identity) for a HF folder; keeps `expected_names(arch)`."""
    from safetensors import safe_open

    arch = ModelArch.from_hf_config(read_hf_config(folder))
    wanted = set(expected_names(arch))
    tensors: dict[str, torch.Tensor] = {}
    filled: dict[str, set[int]] = {}  # stacked expert tensor -> the experts copied into it
    files = shard_files(folder)
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                expert = _EXPERT.match(name)
                stacked = f"{expert.group(1)}.{expert.group(3)}" if expert else ""
                if expert and stacked in wanted:
                    _stack(tensors, filled, stacked, int(expert.group(2)), f.get_tensor(name), arch.num_experts)
                elif name in wanted:
                    tensors[name] = f.get_tensor(name).to(torch.float32).contiguous()
                else:
                    logger.debug("event=safetensors_tensor_skipped name=%s", name)
    for stacked, experts in filled.items():
        if len(experts) != arch.num_experts:  # left out: the weights check names it missing
            del tensors[stacked]
            logger.warning("event=safetensors_experts_incomplete name=%s found=%d", stacked, len(experts))
    return arch, tensors, folder_identity(folder, files)


def _stack(tensors: dict[str, torch.Tensor], filled: dict[str, set[int]], stacked: str, expert: int,
           weight: torch.Tensor, num_experts: int) -> None:
    """Copy one expert's weight [out, in] into slot `expert` of tensors[stacked] [num_experts, out, in] (float32)."""
    if expert >= num_experts:
        raise ValueError(f"{stacked}: expert {expert} past the config's num_experts={num_experts}; "
                         "the checkpoint and its config.json disagree.")
    if stacked not in tensors:
        tensors[stacked] = torch.empty(num_experts, *weight.shape, dtype=torch.float32)
        filled[stacked] = set()
    tensors[stacked][expert] = weight
    filled[stacked].add(expert)


def folder_identity(folder: Path, files: list[Path]) -> str:
    """Folder name, total size and a hash of config.json and every byte of every shard (each
    shard's SHA-256 computed once per (path, size, mtime), file_digest.py, as for a GGUF)."""
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    total = 0
    for file in files:
        total += file.stat().st_size
        digest.update(file_sha256(file).encode())
    return f"{safe_stem(folder.resolve().name + '.dir')}-{total}-{digest.hexdigest()[:16]}"
