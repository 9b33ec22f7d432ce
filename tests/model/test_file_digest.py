"""The whole-file digest behind a GGUF's identity (kvstrata/model/file_digest.py, gguf_header.py):
every byte counts, and the digest is computed once per (path, size, mtime), kept under the home."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvstrata.model import file_digest
from kvstrata.model.file_digest import file_sha256
from kvstrata.model.gguf_header import gguf_identity, read_gguf_header

OLD_NS = 1_600_000_000 * 10**9  # an mtime long before any digest is taken: not racy


@pytest.fixture(autouse=True)
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVSTRATA_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(file_digest, "_memo", {})
    return tmp_path / "home"


def test_a_byte_between_the_old_samples_changes_the_identity(smollm2_path: Path, tmp_path: Path) -> None:
    """The old identity hashed 16 chunks of 64 KiB spread over the data; this byte is in none of them."""
    copy = tmp_path / smollm2_path.name
    shutil.copyfile(smollm2_path, copy)
    os.utime(copy, ns=(OLD_NS, OLD_NS))
    header = read_gguf_header(copy)
    before = gguf_identity(header)
    span = header.file_size - header.data_offset
    at = header.data_offset + span // 16 + 2 * 64 * 1024  # past the end of sample 1, well before sample 2
    with open(copy, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(copy, ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    assert gguf_identity(read_gguf_header(copy)) != before


def test_the_digest_is_kept_by_path_size_and_mtime(tmp_path: Path, fresh_home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"a" * 3_000_000)
    os.utime(path, ns=(OLD_NS, OLD_NS))
    first = file_sha256(path)
    assert list((fresh_home / "digests").glob("*.json"))  # remembered across processes
    monkeypatch.setattr(file_digest, "_memo", {})
    reads: list[Path] = []
    real = file_digest._hash
    monkeypatch.setattr(file_digest, "_hash", lambda p: reads.append(p) or real(p))
    path.write_bytes(b"b" * 3_000_000)  # same size; mtime put back: what the key cannot see
    os.utime(path, ns=(OLD_NS, OLD_NS))
    assert file_sha256(path) == first and reads == []  # from the record, no read of the file
    os.utime(path, ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    assert file_sha256(path) != first and reads == [path.resolve()]


def test_a_file_changed_just_before_hashing_is_hashed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite within the timestamp granularity keeps size and mtime: a fresh file's digest is
    not trusted later (git's racy-index rule)."""
    path = tmp_path / "fresh.gguf"
    path.write_bytes(b"x" * 1000)
    first = file_sha256(path)
    stat = path.stat()
    path.write_bytes(b"y" * 1000)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_sha256(path) != first
