"""Load a Hugging Face folder (config.json + *.safetensors, optionally sharded) as float32 tensors.

Tensor names are already Hugging Face's; this keeps the ones the architecture uses, drops
extras (rotary `inv_freq` buffers, a tied `lm_head.weight` saved anyway) and upcasts to float32.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.file_digest import file_sha256
from kvstrata.model.gguf_header import safe_stem

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"


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
    files = shard_files(folder)
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in wanted:
                    logger.debug("event=safetensors_tensor_skipped name=%s", name)
                    continue
                tensors[name] = f.get_tensor(name).to(torch.float32).contiguous()
    return arch, tensors, folder_identity(folder, files)


def folder_identity(folder: Path, files: list[Path]) -> str:
    """Folder name, total size and a hash of config.json and every byte of every shard (each
    shard's SHA-256 computed once per (path, size, mtime), file_digest.py, as for a GGUF)."""
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    total = 0
    for file in files:
        total += file.stat().st_size
        digest.update(file_sha256(file).encode())
    return f"{safe_stem(folder.resolve().name + '.dir')}-{total}-{digest.hexdigest()[:16]}"
