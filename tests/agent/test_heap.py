"""The daemon allocates from at most two malloc arenas: its threads, taking turns over months,
otherwise leave one arena each at its high-water mark (bench/soak.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
