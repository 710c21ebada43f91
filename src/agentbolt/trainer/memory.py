"""Giving the memory an update freed back to the operating system.

A LoRA update allocates and frees gigabytes of activations. glibc's allocator keeps freed blocks in its heaps for
reuse instead of returning them, so the process stays as large as its largest update and grows from step to step as
the heaps fragment (measured with ``benchmarks/update_memory.py``, SmolLM2-135M, ~2.2k tokens per step: 3.9-4.3 GB
resident after each update; 0.8 GB when ``malloc_trim(0)`` runs after it). :func:`release_freed_memory` asks glibc
to return those pages (``malloc_trim(3)``, every arena since glibc 2.8).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to do
        return None


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the operating system (glibc ``malloc_trim(0)``); ``False`` where the C
    library has no such call. Never raises."""
    trim = _malloc_trim()
    if trim is None:
        return False
    try:
        trim(0)
    except OSError:
        logger.debug("malloc_trim failed", exc_info=True)
        return False
    return True
