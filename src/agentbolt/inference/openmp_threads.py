"""Ending a thread's OpenMP worker threads when its torch work is done, so the next thread's keep spinning.

PyTorch's CPU kernels run their parallel regions on OpenMP (GNU libgomp in the Linux wheels). libgomp keeps a pool of
worker threads per thread that opened a parallel region: agentbolt's generation thread, the trainer's update thread
and whichever thread loaded the model each keep one. Between two parallel regions a worker spins for about 3 ms
before it sleeps, which is what makes a forward pass of a few hundred small ops cheap; but once the process holds
more OpenMP threads than it has CPUs (libgomp counts every pool's, idle or not), libgomp spins only ~100 iterations
(``gomp_throttled_spin_count_var``), so every worker sleeps after each op and each parallel region starts with a
futex wake-up. Measured on a 2-core machine, Qwen2.5-0.5B, 64 calc requests at concurrency 16 through the embedded
backend in process: 88.4 generated tokens/s and a decode step of 82 ms; after one 2-thread op on another thread
(whose pool then outnumbers the CPUs), 60.4 tokens/s and 116 ms; with that thread's pool released, 80.5 tokens/s
and 86 ms (one run each).

:func:`release_openmp_threads` ends the calling thread's pool (OpenMP 5.0 ``omp_pause_resource_all(omp_pause_soft)``;
the next parallel region on that thread starts its workers again, ~0.1 ms). agentbolt's threads that run torch call
it when their work is done: the generation thread when it has nothing to run, the update thread after each call, the
threads that load a model.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

OMP_PAUSE_SOFT = 1
"""``omp_pause_soft`` of ``omp_pause_resource_t`` (OpenMP 5.0, section 3.2.43)."""

_pause_all: Callable[[int], int] | None = None


def _loaded_libgomp() -> Path | None:
    """The libgomp this process has loaded (torch's own copy first when there are several), from
    ``/proc/self/maps``; None where there is none or no ``/proc`` (not Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split(maxsplit=5)[-1] for line in maps.splitlines() if "/libgomp" in line}
    found = sorted((Path(p) for p in paths if Path(p).name.startswith("libgomp")), key=str)
    if not found:
        return None
    under_torch = [p for p in found if "torch" in p.parts]
    return (under_torch or found)[0]


def _pause_function() -> Callable[[int], int] | None:
    global _pause_all
    if _pause_all is None:
        path = _loaded_libgomp()
        if path is None:  # torch not loaded yet, or another OpenMP runtime: look again next time
            return None
        try:
            function = ctypes.CDLL(str(path)).omp_pause_resource_all
        except (OSError, AttributeError):  # a libgomp older than GCC 9 has no pause
            logger.debug("no omp_pause_resource_all in %s", path, exc_info=True)
            return None
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
        _pause_all = function
    return _pause_all


def release_openmp_threads() -> bool:
    """End the OpenMP worker threads the calling thread started (its libgomp thread pool); the next parallel region
    on this thread starts them again. Call it from a thread whose torch work is done for a while, outside any
    parallel region.

    Returns:
        True when the pool was released; False where the process has no libgomp loaded (another OpenMP runtime, or
        not Linux) or libgomp refused. Never raises.
    """
    pause = _pause_function()
    if pause is None:
        return False
    try:
        return pause(OMP_PAUSE_SOFT) == 0
    except OSError:
        logger.debug("omp_pause_resource_all failed", exc_info=True)
        return False


def run_then_release(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``, then :func:`release_openmp_threads` on this thread (also when it raised). For work
    handed to a thread that then goes back to a pool, e.g. ``await asyncio.to_thread(run_then_release, load, path)``."""
    try:
        return function(*args, **kwargs)
    finally:
        release_openmp_threads()
