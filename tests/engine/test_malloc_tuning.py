"""glibc malloc's tuning (kvstrata/engine/malloc_tuning.py), read from glibc's own books and the process's
RSS, a subprocess each (mallopt is process-wide): a freed step-sized block stays in the heap for the next
step, and a block one thread freed serves another thread's next one."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest


HEAP = """
import ctypes, sys, torch
from kvstrata.engine.malloc_tuning import keep_freed_heap
libc = ctypes.CDLL(None)
if sys.argv[1] == "tuned":
    print(keep_freed_heap(), file=sys.stderr)
else:  # glibc's starting threshold, fixed: no free before this can have moved it (glibc adapts it)
    assert libc.mallopt(-3, 128 * 1024) == 1  # M_MMAP_THRESHOLD

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = MallInfo2
mapped = libc.mallinfo2().hblkhd
block = torch.empty(24 << 20, dtype=torch.uint8).fill_(1)  # a step's largest tensor
mapped = libc.mallinfo2().hblkhd - mapped  # bytes of it in mmap'd chunks (unmapped when freed)
del block
print(mapped >= 24 << 20, libc.mallinfo2().fordblks >= 24 << 20)  # mmap'd?  kept free in the heap?
"""


def _heap(mode: str) -> tuple[bool, bool]:
    """(the freed 24 MiB block was mmap'd, it stays in the heap after free) in a fresh process."""
    out = subprocess.run([sys.executable, "-c", HEAP, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if mode == "tuned":
        assert out.stderr.strip().splitlines()[-1].startswith("glibc "), out.stderr
    mapped, kept = out.stdout.split()
    return mapped == "True", kept == "True"


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33 (mallinfo2)")
def test_keep_freed_heap_keeps_a_freed_block_for_the_next_step() -> None:
    """What used to be counted in page faults (which vary with whatever else the process freed
    before), read from glibc's own books: with keep_freed_heap a step-sized block comes from the
    heap and stays there once freed, so the next step reuses pages already faulted in; with glibc's
    starting threshold it is an mmap, handed back to the OS at free and faulted in again."""
    assert _heap("tuned") == (False, True)
    assert _heap("default") == (True, False)  # the check can fail


ARENAS = """
import ctypes, sys, threading
from kvstrata.engine.malloc_tuning import keep_freed_heap
import torch
print(keep_freed_heap(), file=sys.stderr)
if sys.argv[1] == "arenas":  # the tuning's thresholds, but glibc's usual arena per thread
    assert ctypes.CDLL(None).mallopt(-8, 8) == 1  # M_ARENA_MAX

def rss() -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) << 10

def step() -> None:  # another thread's step: a block faulted in, then freed
    block = torch.empty(24 << 20, dtype=torch.uint8).fill_(1)
    del block

t = threading.Thread(target=step)
t.start()
t.join()
before = rss()
block = torch.empty(16 << 20, dtype=torch.uint8).fill_(1)  # this thread's step: a smaller block
print(rss() - before)  # new pages faulted in for it
"""


def test_one_arena_lets_a_thread_reuse_what_another_freed() -> None:
    """The engine's step runs on its own thread, the kernels' on theirs, the server's on another: with an
    arena per thread, memory one frees stays in its arena while another faults in new pages. After
    keep_freed_heap a 24 MiB block another thread freed serves this thread's next 16 MiB one: RSS does
    not grow (with glibc's arena per thread it grows by the 16 MiB)."""
    def grown(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "arena_max=1" in out.stderr, out.stderr
        return int(out.stdout.split()[-1])

    assert grown("tuned") < 4 << 20
    assert grown("arenas") >= 12 << 20  # the check can fail
