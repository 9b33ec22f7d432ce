"""The GGUF header reader's kept parses (kvstrata/model/gguf_header.py): a start reads the header several
times and parses it once; a file whose header bytes change is parsed again, whatever its timestamps say."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from kvstrata.model.gguf_header import read_gguf_header


def test_a_header_is_parsed_once_until_its_bytes_change(smollm2_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_path, copy)
    first = read_gguf_header(copy)
    assert read_gguf_header(copy) is first  # kept
    assert read_gguf_header(os.path.relpath(copy)) is first  # the same file by another spelling
    name = first.metadata["general.name"]
    st = copy.stat()
    with open(copy, "r+b") as f:  # rewrite one byte of the name in place, then put the timestamps back
        at = f.read(first.data_offset).index(name.encode())
        f.seek(at)
        f.write(b"X")
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = read_gguf_header(copy)
    assert again is not first and again.metadata["general.name"] == "X" + name[1:]
    assert again.header_sha256 != first.header_sha256
