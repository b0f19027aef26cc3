"""The daemon's C heap: at most two of glibc's malloc arenas, trimmed now and then.

glibc gives a thread that allocates an arena of its own, up to eight per core, and never gives
an arena's pages back while small blocks still live among them. The daemon's threads (the
API's workers, the queue, sampler and service loops, the router) take turns over months, so
every arena stays at its own high-water mark: in bench/soak.py the RSS grew by 38 % over the
first 6,000 jobs with the default, by 3 % with two arenas (docs/benchmarks/soak.md). The
daemon's threads mostly wait on I/O, so sharing two arenas costs them nothing that shows.

Even in two arenas, the free pages between live blocks stay in the process until glibc is
asked for them back: with jobs and service cycles beside each other the RSS still grew by about
1 MiB per 1,000 jobs while Python's own heap stayed flat (tracemalloc). `trim()` hands them back
(malloc_trim walks every arena and releases each free page); the loop calls it once a minute.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

#: the arenas the daemon allocates from (glibc's own is 8 per core)
ARENAS = 2
#: glibc's mallopt parameter (malloc.h); an administrator's MALLOC_ARENA_MAX wins over it
_M_ARENA_MAX = -8
ENV = "MALLOC_ARENA_MAX"


def limit_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """At most ARENAS arenas for this process from now on, unless MALLOC_ARENA_MAX says how
    many; whether the limit was set (not on a C library without mallopt)."""
    if ENV in environ:
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_ARENA_MAX, ARENAS))


def trim() -> bool:
    """Give the free pages of the C heap back to the system; whether any went (False too on a
    C library without malloc_trim)."""
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return malloc_trim is not None and bool(malloc_trim(0))
