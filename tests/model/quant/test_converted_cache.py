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


def test_this_files_folders_of_other_layouts_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save removes this file's folders that other code wrote (any group: one the new code no longer
    builds, as the int8 head where the head went to 4 bits), keeps its other groups of this layout and
    other files' folders."""
    from kvstrata.model.quant import converted_cache

    root = tmp_path / "converted"
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    for p in (a, b):
        p.write_bytes(b"GGUF")
    monkeypatch.setattr(converted_cache, "LAYOUT", "old")
    for group in ("tiles", "int8head"):
        ConvertedCache(root, "a-4-1", a).save(group, tensors())
    ConvertedCache(root, "b-4-2", b).save("tiles", tensors())
    monkeypatch.setattr(converted_cache, "LAYOUT", "new")
    ConvertedCache(root, "a-4-1", a).save("q4head", tensors())
    assert sorted(p.name for p in root.iterdir()) == ["a-4-1-q4head-new", "b-4-2-tiles-old"]
    ConvertedCache(root, "a-4-1", a).save("tiles", tensors())
    assert sorted(p.name for p in root.iterdir()) == ["a-4-1-q4head-new", "a-4-1-tiles-new", "b-4-2-tiles-old"]


def test_save_and_map_serves_the_written_copy_while_it_is_committed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The first start maps what it wrote at once; the sync and rename run in a thread that a load of the
    group waits for. A write that cannot be synced never gets the folder's name (a crash would have left
    bytes that never reached the disk under it), and the start keeps serving its mapped copy."""
    from kvstrata.model.quant import converted_cache

    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF")
    cache = ConvertedCache(tmp_path / "converted", "m-4-abc", source)
    built = tensors()
    synced = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.3)  # the load below must wait for it
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(converted_cache.os, "fsync", slow_fsync)
    mapped = cache.save_and_map("tiles", built)
    assert all(torch.equal(mapped[n], t) and (t.numel() == 0 or mapped[n].data_ptr() != t.data_ptr())
               for n, t in built.items())
    back = cache.load("tiles")  # waits for the commit: the folder is in place, synced
    assert len(synced) == 2 and back is not None and torch.equal(back["wsum"], built["wsum"])
    assert not converted_cache._pending and cache.folder("tiles").is_dir()
    assert [p.name for p in cache.root.iterdir()] == [cache.folder("tiles").name]  # no temporary folder left

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(converted_cache.os, "fsync", failing_fsync)
    head = cache.save_and_map("q4head", built)
    assert cache.load("q4head") is None and not cache.folder("q4head").exists()
    assert [p.name for p in cache.root.iterdir()] == [cache.folder("tiles").name]
    assert torch.equal(head["f32"], built["f32"])  # the mapped pages outlive their removed file


def mapped_from(t: torch.Tensor, folder: Path) -> bool:
    """Whether t's bytes lie in this process's mapping of folder/data.bin (/proc/self/maps)."""
    target = str((folder / "data.bin").resolve())
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *_, path = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in span.split("-"))
        if path.strip() == target and lo <= t.data_ptr() < hi:
            return True
    return False


@pytest.mark.parametrize("head_bits", [8, 4])
def test_smollm2_kept_tiles_and_head_are_the_converted_ones(smollm2_path: Path, tmp_path: Path, head_bits: int) -> None:
    """Loaded for the integer kernels with no dense copies (as wide files are), converted without a cache,
    then twice with one: the first load converts, saves and then serves the saved copy mapped from disk
    (as later loads do, so ranks that convert at once share its pages), the second maps it; the tiles and
    the quantized head (int8, or 4-bit) built from the file's rows are the converted ones either way."""
    from kvstrata.model.embed_head import EMBED, Head
    from kvstrata.model.weights import load_weights

    def load(root: Path | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        w = load_weights(smollm2_path, torch.float32, "int_dot", keep_dense=False, cache_root=root)
        head = Head(None, w.rows[EMBED], quantized=True, int_dot=True, dtype=torch.float32, head_bits=head_bits)
        assert head.bits == head_bits
        return w.tiles, head.quant.tensors()

    tiles, head = load(None)
    (first_tiles, first_head), (kept_tiles, kept_head) = load(tmp_path), load(tmp_path)
    folders = {f.name.split("-")[-2]: f for f in tmp_path.iterdir()}
    assert sorted(folders) == ["intdot", "tiles"]  # ...-int8head-intdot-<layout> (q4head), ...-tiles-<layout>
    assert tiles and sorted(kept_tiles) == sorted(first_tiles) == sorted(tiles)
    assert sorted(kept_head) == sorted(first_head) == sorted(head)
    for group, converted in (("tiles", (first_tiles, kept_tiles, tiles)), ("intdot", (first_head, kept_head, head))):
        first, kept, built = converted
        for n, t in built.items():
            for loaded in (first[n], kept[n]):
                assert loaded.dtype == t.dtype and torch.equal(loaded, t), n
                assert t.numel() == 0 or mapped_from(loaded, folders[group]), (group, n)
            assert not mapped_from(t, folders[group])
    assert all(kept_tiles[n].data_ptr() != first_tiles[n].data_ptr() for n in tiles)  # mapped anew
