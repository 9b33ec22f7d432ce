"""glibc malloc told to keep the memory a step frees, in one heap for every thread (`--malloc-tuning auto`).

The first cold prompt after start pays for a fresh heap, and with glibc's defaults (an mmap threshold
that adapts, the heap top trimmed above twice it) later cold prompts keep faulting in the large blocks a
step frees: the two thresholds below keep the freed memory mapped (figures: docs/production.md,
"Start-up warm-up"). And glibc gives each thread that allocates its own arena: memory the engine's step
frees on one thread stays in that arena while another thread (the kernels' workers, the server's) faults
in new pages, so the peak counts both. One arena makes any thread's freed memory serve the next
allocation (glibc attaches a thread to an arena at its first allocation: threads that allocated before
the engine starts keep theirs).
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB (a 2k-token step's MLP) come from the heap
TRIM_THRESHOLD = 1 << 30  # the heap keeps up to 1 GiB free at its top instead of handing it back
# one heap for every thread: memory one thread frees (the engine's step) serves the next allocation of any
# other (the kernels' worker threads, the server's), instead of each arena keeping its own free memory
# (1B Q4_K_M server, three 2k-token prompts: peak RSS 2,152 -> 2,060 MiB)
ARENA_MAX = 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"))


def keep_freed_heap() -> str:
    """Fix glibc's mmap and trim thresholds (process-wide), so the memory a step frees is reused,
    not unmapped and faulted in again, and keep to one arena (threads made after this share the heap).
    Returns what was done, for the start-up log."""
    try:
        libc = _libc()
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        version = libc.gnu_get_libc_version().decode()
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): leave its allocator alone
        return "unchanged (not glibc)"
    if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return f"unchanged (glibc {version} refused mallopt)"
    arenas = f" arena_max={ARENA_MAX}" if libc.mallopt(M_ARENA_MAX, ARENA_MAX) == 1 else ""
    return f"glibc {version} mmap_threshold={MMAP_THRESHOLD >> 20}MiB trim_threshold={TRIM_THRESHOLD >> 20}MiB{arenas}"


def release_freed_heap() -> bool:
    """Give the heap's free memory back to the system once (glibc's malloc_trim): what loading freed
    (decoded blocks, packing temporaries) would otherwise stay in RSS under the 1 GiB trim threshold."""
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError, TypeError):
        return False
