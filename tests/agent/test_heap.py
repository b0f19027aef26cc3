"""The daemon allocates from at most two malloc arenas: its threads, taking turns over months,
otherwise leave one arena each at its high-water mark (bench/soak.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.agent.daemon_support import until

from gpupool.agent import heap
from gpupool.agent.agent import Agent

#: eight threads allocate at once (a block past Python's small-object allocator: malloc's),
#: then the process counts its arenas in malloc_info's report
ARENAS_USED = r"""
import ctypes, sys, threading
from gpupool.agent.heap import limit_arenas
if sys.argv[1] == "limited":
    assert limit_arenas({})
libc = ctypes.CDLL(None)
together = threading.Barrier(8)
kept = []
def allocate():
    kept.append(bytearray(1 << 16))
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
text, size = ctypes.c_char_p(), ctypes.c_size_t()
libc.open_memstream.restype = ctypes.c_void_p
stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(text), ctypes.byref(size)))
libc.malloc_info(0, stream)
libc.fclose(stream)
print(text.value.decode().count("<heap nr="))
"""


def _arenas(how: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ARENAS_USED, how], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_at_most_two_arenas_however_many_threads_allocate() -> None:
    assert _arenas("default") > heap.ARENAS  # what glibc does alone
    assert _arenas("limited") <= heap.ARENAS


def test_an_administrators_malloc_arena_max_is_left_alone() -> None:
    assert heap.limit_arenas({heap.ENV: "4"}) is False


def test_the_daemon_limits_its_arenas_when_it_starts(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    monkeypatch.setattr(heap, "limit_arenas", lambda: calls.append(True) or True)
    agent.start()
    assert calls == [True]


def test_the_loop_trims_the_heap(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(True) or True)
    agent.start()
    assert until(lambda: calls, timeout=10)


#: 64 MiB in 1 KiB blocks of malloc's heap, all freed but the last (it pins the heap's top, so
#: that glibc's own trim at free cannot give the pages back), then the RSS before and after trim
FREED_PAGES = r"""
import ctypes, sys
from gpupool.agent.heap import trim
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [libc.malloc(1024) for _ in range(65536)]
for block in blocks[:-1]:
    libc.free(block)
before = rss_mib()
print(trim() if sys.argv[1] == "trim" else False, before, rss_mib())
"""


@pytest.mark.parametrize("how", ["trim", "no-trim"])
def test_trim_gives_the_heaps_free_pages_back(how: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FREED_PAGES, how], capture_output=True, text=True, check=True
    )
    trimmed, before, after = done.stdout.split()
    if how == "trim":
        assert trimmed == "True" and float(before) - float(after) > 48, done.stdout
    else:
        assert float(before) - float(after) < 8, done.stdout  # glibc keeps them without it
