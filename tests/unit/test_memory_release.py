"""release_freed_memory: freed heap pages go back to the system (glibc malloc_trim), measured on this process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentbolt.trainer.memory import release_freed_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_freed_heap_pages_are_returned() -> None:
    # 2000 blocks of 100 kB (below glibc's mmap threshold: heap memory), each followed by a small block that stays,
    # so the freed space is in the middle of the heap, where free() alone never gives it back.
    blocks, keepers = [], []
    for _ in range(2000):
        block = bytearray(100_000)
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        blocks.append(block)
        keepers.append(bytearray(64))
    del blocks
    before = _rss_mb()
    assert release_freed_memory() is True
    after = _rss_mb()
    assert before - after > 100, (before, after)  # ~200 MB were freed; most of it must leave the process
    assert len(keepers) == 2000
