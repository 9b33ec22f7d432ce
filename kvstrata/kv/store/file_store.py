"""FileStore: the embedded L3 for one machine, one file per page under a directory.

    <path>/<key[:2]>/<key>                 a value (written whole: temp file, then rename)
    <path>/<key[:2]>/.<key>.<pid>.<n>.tmp   a write in progress (readers never see it)

Several processes may share the directory: a value appears atomically by `os.replace`, and a reader
that loses a race with cleanup just misses. Reads bump the file's mtime, so the size cap drops the
least recently used values first: past `max_size_gb`, the oldest files go until 90% of the cap is left.
A value written with a lifetime (`ttl_s`: prompt_cache_retention "24h") gets its expiry as mtime, in
the future, so cleanup takes it last until it expires (reads never move that mtime back); from then
on it is an old value like any other.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

_STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died


class FileStore:
    def __init__(self, path: str | os.PathLike[str] | None = None, max_size_gb: float = 10.0) -> None:
        home = Path(os.environ.get("KVSTRATA_HOME") or "~/.cache/kvstrata")
        self.path = Path(path or home / "kvstore").expanduser()
        self.path.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_size_gb * 1e9)
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._size = sum(size for _, size, _ in self._scan())  # approximate between cleanups

    def _file(self, key: str) -> Path:
        if len(key) < 3 or "/" in key or key.startswith("."):
            raise ValueError(f"bad store key {key!r}")
        return self.path / key[:2] / key

    def batch_exists(self, keys: list[str]) -> int:
        n = 0
        for key in keys:
            if not self._file(key).is_file():
                break
            n += 1
        return n

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key in keys:
            f = self._file(key)
            try:
                out.append(f.read_bytes())
                if f.stat().st_mtime < time.time():  # a retained value keeps its expiry
                    os.utime(f)  # least recently used = oldest mtime
            except FileNotFoundError:
                out.append(None)
        return out

    def batch_put(self, keys: list[str], values: list[bytes], ttl_s: float | None = None) -> None:
        added = 0
        expires = time.time() + ttl_s if ttl_s is not None else None
        for key, value in zip(keys, values, strict=True):
            f = self._file(key)
            f.parent.mkdir(exist_ok=True)
            tmp = f.parent / f".{key}.{os.getpid()}.{next(self._seq)}.tmp"
            try:
                with open(tmp, "wb") as fh:
                    fh.write(value)
                if expires is not None:
                    os.utime(tmp, (expires, expires))
                os.replace(tmp, f)
            finally:
                tmp.unlink(missing_ok=True)
            added += len(value)
        with self._lock:
            self._size += added
            if self.max_bytes and self._size > self.max_bytes:
                self._cleanup()

    def close(self) -> None:
        pass

    # -- internals -------------------------------------------------------------------------------

    def _scan(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every value; removes temp files left by dead writers."""
        found: list[tuple[float, int, Path]] = []
        now = time.time()
        for sub in os.scandir(self.path):
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                if entry.name.startswith("."):
                    if now - st.st_mtime > _STALE_TMP_S:
                        Path(entry.path).unlink(missing_ok=True)
                    continue
                found.append((st.st_mtime, st.st_size, Path(entry.path)))
        return found

    def _cleanup(self) -> None:
        """Drop least recently used values until 90% of the cap is left (caller holds the lock)."""
        files = sorted(self._scan(), key=lambda t: t[0])
        size = sum(s for _, s, _ in files)
        target = int(self.max_bytes * 0.9)
        removed = 0
        for _, s, f in files:
            if size <= target:
                break
            f.unlink(missing_ok=True)
            size -= s
            removed += 1
        self._size = size
        logger.info("file_store_cleanup removed=%d size_bytes=%d cap_bytes=%d", removed, size, self.max_bytes)
