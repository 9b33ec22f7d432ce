"""The SHA-256 of a whole file, computed once and remembered by (path, size, mtime).

A model's identity namespaces its KV pages in every tier, L3 included, which servers share: two
files that differ anywhere must not share pages, so the identity hashes every byte (a sampled
hash let fine-tunes that differ between samples share L3 pages). Reading a multi-GB file at every
start would be slow, so the digest is kept under the kvstrata home (`digests/`, one small JSON
file per path) and reused while the file's resolved path, size and mtime are unchanged.

As git does for its index, a digest taken less than `RACY_S` after the file's last change is not
trusted later: a rewrite within the filesystem's timestamp granularity could leave size and mtime
as they were.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from kvstrata.model.fetch import model_home

CHUNK = 1 << 20
RACY_S = 2.0
_memo: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of the file's bytes."""
    resolved = Path(path).resolve()
    st = resolved.stat()
    key = (str(resolved), st.st_size, st.st_mtime_ns)
    if key in _memo:
        return _memo[key]
    record = _record_path(resolved)
    kept = _read(record)
    if kept is not None and [kept.get("path"), kept.get("size"), kept.get("mtime_ns")] == list(key) \
            and not _racy(st.st_mtime_ns, kept.get("hashed_ns")):
        digest = str(kept["sha256"])
    else:
        hashed_ns = time.time_ns()
        digest = _hash(resolved)
        _write(record, {"path": key[0], "size": key[1], "mtime_ns": key[2], "hashed_ns": hashed_ns,
                        "sha256": digest})
        if _racy(st.st_mtime_ns, hashed_ns):
            return digest  # not remembered in this process either
    _memo[key] = digest
    return digest


def _racy(mtime_ns: int, hashed_ns: object) -> bool:
    return not isinstance(hashed_ns, int) or hashed_ns - mtime_ns < RACY_S * 1e9


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)  # hashlib drops the GIL for large updates
    return digest.hexdigest()


def _record_path(resolved: Path) -> Path:
    return model_home() / "digests" / f"{hashlib.sha256(str(resolved).encode()).hexdigest()[:32]}.json"


def _read(record: Path) -> dict[str, object] | None:
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _write(record: Path, body: dict[str, object]) -> None:
    """Atomically, and never fatally: a read-only home only costs a re-hash next time."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{record.name}.", suffix=".tmp", dir=record.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, record)
    except OSError:
        pass
