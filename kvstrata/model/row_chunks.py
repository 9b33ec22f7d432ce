"""How a wide step on the integer kernels is cut into chunks of rows (`LlamaModel._layers`): each chunk
runs the row-wise parts of a layer (q/k/v with RoPE and the K/V write, o, the MLP) while attention takes
all rows at once, so a long prompt's activations stay a few MiB a layer."""
from __future__ import annotations

from kvstrata.model.attention import AttentionMetadata, PrefillSeq

CHUNK_BYTES = 8 << 20  # the [rows, 2I] gate/up activations a wide integer-kernel step holds at once ...
CHUNK_MIN_ROWS = 128  # ... in chunks of at least this many rows (each chunk reads the layer's weights again)
def chunk_rows(intermediate: int, elem: int) -> int:
    """Rows a wide integer-kernel step runs its row-wise parts in (`LlamaModel._layers`): a multiple of 16."""
    return max(CHUNK_MIN_ROWS, CHUNK_BYTES // (2 * intermediate * elem) // 16 * 16)


def chunks(total: int, rows: int) -> list[slice]:
    """[0, total) in slices of `rows` (the last shorter)."""
    return [slice(r0, min(r0 + rows, total)) for r0 in range(0, total, rows)]


def prompt_chunks(meta: AttentionMetadata, T: int, rows: int) -> list[tuple[slice, AttentionMetadata]] | None:
    """A step that is one prompt's rows alone, cut in chunks of `rows`: each chunk's rows and the metadata
    of attention over the context up to its last row (the rows are the last of that context: K/V of the
    chunks before it is already written). None for a narrower step or one of several sequences."""
    if rows >= T or len(meta.prefill) != 1 or meta.decode_rows is not None:
        return None
    seq = meta.prefill[0]
    if seq.q_start != 0 or seq.q_len != T:
        return None
    out = []
    for r in chunks(T, rows):
        kv_len = seq.kv_len - (T - r.stop)
        sub = PrefillSeq(0, r.stop - r.start, kv_len, seq.pages[: -(-kv_len // meta.page_size)])
        out.append((r, AttentionMetadata(meta.page_size, meta.slot_mapping[r], [sub])))
    return out
