"""The C++ paged decode kernel (kvstrata/model/csrc/paged_decode.cpp) against the torch path it
replaces: the same attention over random, scattered page tables, for each head size, GQA group,
dtype and context length it is built for (contexts are split over spans of a fixed length and merged)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.attention import gather_pages, grouped_decode_attention

PS = 16


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


def case(lens: list[int], heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // PS) for n in lens]
    num_pages = sum(need) + 5
    k = torch.randn(num_pages * PS, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(num_pages * PS, kv_heads, dim, generator=g).to(dtype)
    order = torch.randperm(num_pages, generator=g).tolist()  # pages scattered over the pool
    width = max(need) + 3  # padded page table, as the runner pads it
    pages = torch.zeros(len(lens), width, dtype=torch.long)
    at = 0
    for b, n in enumerate(need):
        pages[b, :n] = torch.tensor(order[at : at + n])
        at += n
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
    return q, k, v, pages, torch.tensor(lens, dtype=torch.long)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    mask = (torch.arange(pages.shape[1] * PS)[None, :] < lens[:, None])[:, None, None, :]
    return grouped_decode_attention(q.float(), gather_pages(k, pages, PS).float(), gather_pages(v, pages, PS).float(), mask)


@pytest.mark.parametrize("dim", cpu_kernels.HEAD_DIMS)
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4), (16, 1), (32, 8), (32, 4)])  # GQA 3:1 .. 16:1 (Llama 3: 4:1)
def test_float32_matches_torch(dim: int, heads: int, kv_heads: int) -> None:
    lens = [1, 17, 300, 2049]  # one token, part pages, one span, several spans
    q, k, v, pages, lt = case(lens, heads, kv_heads, dim, torch.float32, seed=dim + heads)
    out = cpu_kernels.paged_decode(q, k, v, pages, lt, PS)
    torch.testing.assert_close(out, reference(q, k, v, pages, lt), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_match_a_float32_reference(dtype: torch.dtype) -> None:
    q, k, v, pages, lt = case([5, 700, 4000], 9, 3, 64, dtype, seed=3)
    out = cpu_kernels.paged_decode(q, k, v, pages, lt, PS)
    assert out.dtype == dtype
    # float32 accumulation inside; the only rounding is the output's
    torch.testing.assert_close(out.float(), reference(q, k, v, pages, lt), atol=1e-2, rtol=1e-2)


def test_thread_count_does_not_change_the_result() -> None:
    """Spans have a fixed length; the thread count only splits the heads into sets: the same bits."""
    q, k, v, pages, lt = case([3000, 20], 9, 3, 64, torch.float32, seed=4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_kernels.paged_decode(q, k, v, pages, lt, PS)
        torch.set_num_threads(2)
        two = cpu_kernels.paged_decode(q, k, v, pages, lt, PS)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (32, 8)])
@pytest.mark.parametrize("lens", [[40], [1000], [5000], [40, 3000]])
def test_items_over_head_sets_and_spans_match_torch(heads: int, kv_heads: int, lens: list[int]) -> None:
    """An item takes a span of a row's tokens over a set of its KV heads: a short row alone is split
    into sets of heads (1 to kv_heads per item, by the thread count), a long one into spans."""
    q, k, v, pages, lt = case(lens, heads, kv_heads, 64, torch.float32, seed=len(lens) + lens[0])
    want = reference(q, k, v, pages, lt)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            torch.testing.assert_close(cpu_kernels.paged_decode(q, k, v, pages, lt, PS), want, atol=2e-5, rtol=1e-4)
    finally:
        torch.set_num_threads(before)


def verify_rows(q: torch.Tensor, pages: torch.Tensor, lens: list[int],
                rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row b of a case repeated rows[b] times, one token longer each time, on the same pages (as a
    verify step lays out a request's last token and its drafts), with its own queries."""
    g = torch.Generator().manual_seed(7)
    out_lens, out_pages, out_q = [], [], []
    for b, (n, r) in enumerate(zip(lens, rows)):
        for i in range(r):
            out_lens.append(n - r + 1 + i)
            out_pages.append(pages[b])
            out_q.append(torch.randn(q.shape[1:], generator=g).to(q.dtype))
    return torch.stack(out_q), torch.stack(out_pages), torch.tensor(out_lens, dtype=torch.long)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (32, 8, 64), (32, 4, 128), (16, 1, 32)])
def test_a_requests_verify_rows_match_torch(heads: int, kv_heads: int, dim: int) -> None:
    """Rows on one request's pages, each a token longer, are read as one group (up to 64 query rows an
    item, so 16:1 GQA splits 8 rows into two groups); a short row beside them, and groups whose last
    page is shared or not, each attend exactly their own tokens."""
    q, k, v, pages, _ = case([700, 33, 2100, 16], heads, kv_heads, dim, torch.float32, seed=dim)
    vq, vpages, vlens = verify_rows(q, pages, [700, 33, 2100, 16], [8, 1, 5, 3])
    out = cpu_kernels.paged_decode(vq, k, v, vpages, vlens, PS)
    torch.testing.assert_close(out, reference(vq, k, v, vpages, vlens), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_has_the_same_bits_in_any_step(dtype: torch.dtype) -> None:
    """A verify row (and a batch's row) gets the bits it gets alone: its spans do not depend on the other
    rows' lengths or number, nor on the threads (engine/spec/: greedy output the same with drafts). The
    rows' lengths cross span boundaries (256 tokens) within a group."""
    lens, rows = [700, 260, 2100, 5000, 16], [8, 8, 5, 3, 1]
    q, k, v, pages, _ = case(lens, 32, 8, 64, dtype, seed=5)
    vq, vpages, vlens = verify_rows(q, pages, lens, rows)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            step = cpu_kernels.paged_decode(vq, k, v, vpages, vlens, PS)
            for i in range(len(vlens)):
                alone = cpu_kernels.paged_decode(vq[i : i + 1], k, v, vpages[i : i + 1], vlens[i : i + 1], PS)
                assert torch.equal(alone[0], step[i]), (threads, i, int(vlens[i]))
    finally:
        torch.set_num_threads(before)


def test_rows_on_other_pages_are_not_grouped() -> None:
    """Rising lengths alone do not group rows: a row whose pages differ over the shorter row's length
    reads its own pages."""
    q, k, v, pages, _ = case([300, 301], 9, 3, 64, torch.float32, seed=11)
    lens = torch.tensor([300, 301])
    same = pages.clone()
    same[1] = pages[0]
    same[1, 300 // PS + 1 :] = 0
    same[1, 300 // PS] = pages[1, 0]  # row 1 has row 0's pages but its last one, which differs
    for table in (pages, same):
        out = cpu_kernels.paged_decode(q, k, v, table, lens, PS)
        torch.testing.assert_close(out, reference(q, k, v, table, lens), atol=2e-5, rtol=1e-4)


def test_bad_inputs_raise_instead_of_reading_out_of_bounds() -> None:
    q, k, v, pages, lt = case([40], 9, 3, 64, torch.float32)
    too_long = torch.tensor([pages.shape[1] * PS + 1])
    with pytest.raises(RuntimeError, match="outside its pages"):
        cpu_kernels.paged_decode(q, k, v, pages, too_long, PS)
    with pytest.raises(RuntimeError, match="outside its pages"):
        cpu_kernels.paged_decode(q, k, v, pages, torch.tensor([0]), PS)
    with pytest.raises(RuntimeError, match="int64"):
        cpu_kernels.paged_decode(q, k, v, pages.int(), lt, PS)
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_kernels.paged_decode(q, k.double(), v, pages, lt, PS)


def test_page_ids_outside_the_pool_raise() -> None:
    """The ids a row reads are checked against the pool (as rope_store checks its slots); the padding
    past a row's pages is never read, so it may hold anything."""
    q, k, v, pages, lt = case([40, 3], 9, 3, 64, torch.float32)
    num_pages = k.shape[0] // PS
    for bad in (num_pages, -1, 1 << 40):
        wrong = pages.clone()
        wrong[0, 2] = bad  # the third of row 0's three pages
        with pytest.raises(RuntimeError, match="outside the pool"):
            cpu_kernels.paged_decode(q, k, v, wrong, lt, PS)
    padded = pages.clone()
    padded[1, 1:] = 1 << 40  # row 1 reads one page
    torch.testing.assert_close(cpu_kernels.paged_decode(q, k, v, padded, lt, PS), reference(q, k, v, pages, lt),
                               atol=2e-5, rtol=1e-4)


EMPTY_BATCH = """
import torch
from kvstrata.model import cpu_kernels
assert cpu_kernels.load_kernels()
out = cpu_kernels.paged_decode(torch.zeros(0, 9, 64), torch.zeros(64, 3, 64), torch.zeros(64, 3, 64),
                               torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, dtype=torch.long), 16)
print(tuple(out.shape))
"""


def test_an_empty_batch_returns_an_empty_result() -> None:
    """In a child process: the span split divided by the batch size, and SIGFPE killed the server."""
    done = subprocess.run([sys.executable, "-c", EMPTY_BATCH], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["(0,", "9,", "64)"]


def test_supports_names_what_falls_back() -> None:
    q = torch.zeros(1, 9, 64)
    assert cpu_kernels.paged_decode_supports(q, torch.zeros(4, 3, 64))
    assert not cpu_kernels.paged_decode_supports(torch.zeros(1, 9, 80), torch.zeros(4, 3, 80))  # head size
    assert not cpu_kernels.paged_decode_supports(torch.zeros(1, 32, 64), torch.zeros(4, 1, 64))  # group of 32
    assert not cpu_kernels.paged_decode_supports(q.double(), torch.zeros(4, 3, 64).double())


def test_build_tag_follows_the_source(tmp_path) -> None:
    other = tmp_path / "paged_decode.cpp"
    other.write_bytes(cpu_kernels.SOURCES[0].read_bytes() + b"\n// changed\n")
    assert cpu_kernels.build_tag((other, *cpu_kernels.SOURCES[1:])) != cpu_kernels.build_tag()


def test_every_source_and_header_is_in_the_build_tag() -> None:
    # a header left out of HEADERS would leave an edit of it unbuilt: the cached library of the old tag loads
    csrc = cpu_kernels.SOURCES[0].parent
    assert set(cpu_kernels.SOURCES) == set(csrc.glob("*.cpp"))
    assert set(cpu_kernels.HEADERS) == set(csrc.glob("*.h"))



def test_a_lock_left_by_a_killed_build_does_not_hang_the_next() -> None:
    """torch's build lock is a plain file; one left by a builder killed mid-build made every later
    load wait forever. In a fresh process (a second load of the library in this one would register
    the op twice), a leftover lock next to the built library is cleared and the load succeeds."""
    build_dir = cpu_kernels.model_home() / "torch_extensions" / f"kvstrata_cpu_kernels_{cpu_kernels.build_tag()}"
    (build_dir / "lock").write_text("")  # what torch's FileBaton leaves when its holder dies
    code = "from kvstrata.model import cpu_kernels; print(cpu_kernels.load_kernels())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "True", done.stderr[-2000:]
    assert not (build_dir / "lock").exists()


def test_builds_use_the_ninja_of_the_package_whatever_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ninja versions hash build commands differently, so a start that found the system's ninja after
    one that found the package's rebuilt every kernel: the package's goes first on PATH, once."""
    import ninja

    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", "/bin"]))
    cpu_kernels.use_package_ninja()
    cpu_kernels.use_package_ninja()
    path = os.environ["PATH"].split(os.pathsep)
    assert path == [ninja.BIN_DIR, "/usr/bin", "/bin"]
    assert Path(shutil.which("ninja") or "").parent == Path(ninja.BIN_DIR)
