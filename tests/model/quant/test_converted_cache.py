"""A GGUF's converted weights kept on disk (kvstrata/model/quant/converted_cache.py): a group comes back
as it was saved, damaged or missing folders read as absent, a home that cannot be written costs nothing,
and folders of deleted GGUFs go; SmolLM2's kept tiles and int8 head are the converted ones."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from kvstrata.model.quant.converted_cache import ConvertedCache


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "tiles": torch.randint(0, 256, (3, 5, 144), dtype=torch.uint8, generator=g),
        "scales": torch.randn(7, generator=g).to(torch.bfloat16),
        "wsum": torch.randint(-1000, 1000, (16,), dtype=torch.int32, generator=g),
        "none": torch.empty(0, 8, dtype=torch.int8),
        "f32": torch.randn(2, 3, generator=g),
    }


def test_a_group_comes_back_as_saved(tmp_path: Path) -> None:
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    cache = ConvertedCache(tmp_path / "converted", "m-4-abc", source)
    assert cache.load("tiles") is None
    saved = tensors()
    assert cache.save("tiles", saved)
    back = cache.load("tiles")
    assert back is not None and list(back) == list(saved)
    for name, t in saved.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
        assert back[name].data_ptr() % 64 == 0 or t.numel() == 0  # page-aligned in the mapped file
    back["tiles"][0, 0, 0] += 1  # copy-on-write: the file keeps what was saved
    assert torch.equal(cache.load("tiles")["tiles"], saved["tiles"])
    assert cache.save("tiles", {"other": torch.zeros(1)})  # already there: kept as it is
    assert list(cache.load("tiles")) == list(saved)


def test_a_damaged_folder_reads_as_absent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    cache = ConvertedCache(tmp_path / "converted", "m-4-abc", source)
    cache.save("tiles", tensors())
    data = cache.folder("tiles") / "data.bin"
    data.write_bytes(data.read_bytes()[:100])  # cut short
    with caplog.at_level(logging.WARNING):
        assert cache.load("tiles") is None
    assert "converted_cache_unreadable" in caplog.text
    (cache.folder("tiles") / "index.json").write_text("{not json")
    assert cache.load("tiles") is None


def test_a_home_that_cannot_be_written_costs_nothing(tmp_path: Path) -> None:
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would go")
    cache = ConvertedCache(blocked / "converted", "m-4-abc", source)
    assert not cache.save("tiles", tensors())
    assert cache.load("tiles") is None
    built = cache.get_or_build("tiles", tensors)
    assert torch.equal(built["wsum"], tensors()["wsum"])


def test_folders_of_deleted_or_changed_ggufs_go(tmp_path: Path) -> None:
    root = tmp_path / "converted"
    a, b, c = (tmp_path / f"{n}.gguf" for n in "abc")
    for p in (a, b, c):
        p.write_bytes(b"GGUF")
    ConvertedCache(root, "a-4-1", a).save("tiles", tensors())
    ConvertedCache(root, "b-4-2", b).save("tiles", tensors())
    a.unlink()  # deleted
    b.write_bytes(b"GGUF, rewritten")  # another file now
    dead = root / ".tmp-dead"  # a write that died an hour ago
    dead.mkdir()
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    live = root / ".tmp-live"  # another process writing now
    live.mkdir()
    ConvertedCache(root, "c-4-3", c).save("tiles", tensors())
    assert sorted(p.name.split("-")[0] for p in root.iterdir()) == [".tmp", "c"] and live.exists()
    index = json.loads((ConvertedCache(root, "c-4-3", c).folder("tiles") / "index.json").read_text())
    assert index["source"] == {"path": str(c.resolve()), "size": 4}


def test_smollm2_kept_tiles_and_head_are_the_converted_ones(smollm2_path: Path, tmp_path: Path) -> None:
    """Loaded for the integer kernels with no dense copies (as wide files are), twice: the second load maps
    the tiles the first converted, and the int8 head built from the file's rows comes back the same."""
    from kvstrata.model.embed_head import EMBED, Head
    from kvstrata.model.weights import load_weights

    def load() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        w = load_weights(smollm2_path, torch.float32, "int_dot", keep_dense=False, cache_root=tmp_path)
        head = Head(None, w.rows[EMBED], quantized=True, int_dot=True, dtype=torch.float32)
        assert head.int8 is not None
        return w.tiles, head.int8.tensors()

    (tiles, head), (kept_tiles, kept_head) = load(), load()
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 2 and any("-tiles-" in n for n in names) and any("-int8head-intdot-" in n for n in names)
    assert tiles and sorted(kept_tiles) == sorted(tiles) and sorted(kept_head) == sorted(head)
    pairs = [(kept_tiles[n], tiles[n]) for n in tiles] + [(kept_head[n], head[n]) for n in head]
    for kept, converted in pairs:
        assert kept.dtype == converted.dtype and torch.equal(kept, converted)
    assert all(kept_tiles[n].data_ptr() != tiles[n].data_ptr() for n in tiles)  # mapped anew
