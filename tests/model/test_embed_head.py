"""The embedding of a model (kvstrata/model/embed_head.py): its dense rows, or a GGUF's rows read from the
file for each step's tokens (no map pages left behind: tests/model/quant/test_gguf_rows.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kvstrata.model.embed_head import Embedding
from kvstrata.model.quant.gguf_rows import GgufRows


def test_the_files_rows_give_the_dense_embeddings_values(tmp_path: Path) -> None:
    rows, columns = 100, 64
    raw = np.random.default_rng(0).integers(0, 256, (rows, columns // 32 * 34), dtype=np.uint8)
    raw.reshape(rows, -1, 34)[:, :, :2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    path = tmp_path / "m.bin"
    path.write_bytes(raw.tobytes())
    file_rows = GgufRows(path, 0, raw.nbytes, "Q8_0", (rows, columns))
    dense = file_rows.chunk(0, rows, torch.bfloat16)
    ids = torch.tensor([5, 99, 0, 5] + list(range(70)))  # a decode step's few and a prompt's many alike
    for n in (1, 4, len(ids)):
        got = Embedding(None, file_rows, torch.bfloat16)(ids[:n])
        assert got.dtype == torch.bfloat16 and torch.equal(got, Embedding(dense, None, torch.bfloat16)(ids[:n]))
