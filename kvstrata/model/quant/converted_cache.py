"""A GGUF's converted weights kept on disk: written at its first load, mapped from the file at later ones.

Our integer kernels run their own tile layout (int_dot.py), not the GGUF's blocks, and the LM head runs
quantized (int8_head.py, q4_head.py), so a quantized start converts every linear and the head: ~4-5 s of a 1B Q4_K_M
file's start on 2 cores, most of its time to healthy. llama.cpp maps its file and starts in 1-2 s. Here
the converted tensors of a file are saved once under `<model home>/converted/`, and starts map them
(copy-on-write, so nothing can write to the file; pages are read as the kernels touch them, and stay the
kernel's to drop, as a mapped GGUF's are); the start that converts maps what it saved, too.

A group (the tiles, the quantized head) lives in its own folder named by the GGUF's content identity (the
SHA-256 of the whole file) and by `LAYOUT`, a digest of the source that writes the converted bytes: a
change to that code makes a new name, never a stale read. A folder is written under a temporary name,
synced to disk and only then renamed into place whole (the start that writes it maps it at once and
leaves the sync and rename to a thread); `index.json` lists each tensor's dtype, shape and offset in `data.bin`,
whose size is checked before it is used, and the GGUF it came from. A folder that cannot be written (no
space, read-only home) costs the start nothing but the conversion it would have done anyway. Each save
removes the folders whose GGUF is gone or changed size (a deleted download, a test's temporary file),
this file's folders of other layouts (of any group: an int8 head left behind when the head went to 4 bits
too), and temporary folders an hour old (a write that died).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

log = logging.getLogger(__name__)

ALIGN = 4096  # each tensor's offset in data.bin: page-aligned (vector loads like aligned rows)
STALE_TMP_S = 3600.0  # a temporary folder this old is a write that died (a live one takes seconds)
_DTYPES = {str(d): d for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                                torch.bfloat16, torch.float32)}
_pending: dict[Path, threading.Thread] = {}  # folders whose save_and_map is still syncing and renaming them
_pending_lock = threading.Lock()
_SOURCES = ("quant/blocks.py", "quant/int_dot.py", "quant/int8_head.py", "quant/q4_head.py", "gguf_loader.py", "quant/converted_cache.py")


def _layout() -> str:
    root = Path(__file__).resolve().parents[1]  # kvstrata/model
    h = hashlib.sha256()
    for rel in _SOURCES:
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:12]


LAYOUT = _layout()


class ConvertedCache:
    def __init__(self, root: Path, identity: str, source: Path) -> None:
        self.root, self.identity, self.source = Path(root), identity, Path(source).resolve()

    def folder(self, group: str) -> Path:
        return self.root / f"{self.identity}-{group}-{LAYOUT}"

    def load(self, group: str) -> dict[str, torch.Tensor] | None:
        """The group's tensors mapped from disk, or None where it was never written (or is damaged). A save of
        it still being committed by this process (save_and_map) is waited for."""
        folder = self.folder(group)
        with _pending_lock:
            committing = _pending.get(folder)
        if committing is not None:
            committing.join()
        return self._map(folder)

    def _map(self, folder: Path) -> dict[str, torch.Tensor] | None:
        try:
            index = json.loads((folder / "index.json").read_text())
            data = folder / "data.bin"
            if data.stat().st_size != index["size"]:
                raise ValueError(f"data.bin holds {data.stat().st_size} bytes, the index says {index['size']}")
            raw = np.memmap(data, dtype=np.uint8, mode="c") if index["size"] else np.zeros(0, np.uint8)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                whole = torch.from_numpy(raw)
            out = {}
            for name, (dtype, shape, offset, nbytes) in index["tensors"].items():
                out[name] = whole[offset:offset + nbytes].view(_DTYPES[dtype]).view(shape)
            return out
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            log.warning("event=converted_cache_unreadable folder=%s error=%s", folder, exc)
            return None

    def save(self, group: str, tensors: dict[str, torch.Tensor]) -> bool:
        """Write the group whole (atomic rename); False, logged, where it cannot. This file's folders written
        by other layouts go."""
        folder = self.folder(group)
        if folder.exists():
            return True
        tmp = self._write(folder, tensors)
        return tmp is not None and self._commit(tmp, folder)

    def _write(self, folder: Path, tensors: dict[str, torch.Tensor]) -> Path | None:
        """The group written into a new temporary folder (not yet synced), or None, logged, where it cannot be."""
        tmp: Path | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
            entries, offset = {}, 0
            with open(tmp / "data.bin", "wb") as f:
                for name, t in tensors.items():
                    t = t.detach().contiguous().cpu()
                    nbytes = t.numel() * t.element_size()
                    f.seek(offset)
                    if nbytes:
                        f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))  # no copy of the tensor
                    entries[name] = (str(t.dtype), list(t.shape), offset, nbytes)
                    offset = -(-(offset + nbytes) // ALIGN) * ALIGN
                f.truncate(offset)
            source = {"path": str(self.source), "size": self.source.stat().st_size}
            (tmp / "index.json").write_text(json.dumps({"size": offset, "tensors": entries, "source": source}))
            return tmp
        except OSError as exc:
            log.warning("event=converted_cache_not_written folder=%s error=%s", folder, exc)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            return None

    def _commit(self, tmp: Path, folder: Path) -> bool:
        """Sync a written temporary folder to disk, then rename it into place (so a crash never leaves a
        named folder whose bytes did not reach the disk); True where the group is in place after, by this
        write or another process's."""
        try:
            for name in ("data.bin", "index.json"):
                fd = os.open(tmp / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(tmp, folder)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)  # a process that mapped it keeps its pages
            if folder.exists():  # another process wrote it first
                return True
            log.warning("event=converted_cache_not_written folder=%s error=%s", folder, exc)
            return False
        self._prune()
        return True

    def _prune(self) -> None:
        for old in self.root.glob(f"{self.identity}-*"):  # this file's folders of other layouts, any group
            if not old.name.endswith(f"-{LAYOUT}"):
                shutil.rmtree(old, ignore_errors=True)
        for other in self.root.iterdir():
            if other.name.startswith(".tmp-") and time.time() - other.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(other, ignore_errors=True)  # a write that died half-way
            if other.name.startswith(".") or not other.is_dir():
                continue
            try:
                source = json.loads((other / "index.json").read_text())["source"]
                orphan = Path(source["path"]).stat().st_size != source["size"]
            except FileNotFoundError:
                orphan = True  # its GGUF is gone (or the folder was never finished)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if orphan:
                shutil.rmtree(other, ignore_errors=True)

    def get_or_build(self, group: str, build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        kept = self.load(group)
        if kept is not None:
            return kept
        return self.save_and_map(group, build())

    def save_and_map(self, group: str, built: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Save `built` and return the saved copy mapped from disk, so a first start holds what later starts
        hold: file pages, shared by every process that maps them, not a private copy each (two ranks of a 1B
        Q4_K_M converting at once: 3,831 -> 3,172 MiB PSS at healthy). `built` itself where the group could
        not be written or read back. The copy is mapped as soon as it is written; syncing it to disk and
        renaming it into place (~1 s for a 1B Q8_0's tiles, which its first start waited on) go on in a
        thread, which `load` of the same group waits for and the interpreter joins at exit."""
        folder = self.folder(group)
        kept = self.load(group)  # written meanwhile (by another process, or this one's commit still running)
        if kept is not None:
            return kept
        tmp = self._write(folder, built)
        if tmp is None:
            return built
        mapped = self._map(tmp)
        if mapped is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return built

        def commit() -> None:
            try:
                self._commit(tmp, folder)
            finally:
                with _pending_lock:
                    if _pending.get(folder) is threading.current_thread():
                        del _pending[folder]

        thread = threading.Thread(target=commit, name=f"converted-cache-{group}")
        with _pending_lock:
            _pending[folder] = thread
        thread.start()
        return mapped
