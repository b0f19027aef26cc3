"""Memory shares through the interception library: real processes on the simulated driver."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from shim_support import (
    PROGS,
    codes,
    compile_prog,
    make_node,
    read_until,
    run_client,
    shim_env,
    start_client,
)

from gpupool.core.units import GiB, MiB
from gpupool.devices.sim.state import SimState
from gpupool.isolation.launch import ShareLimits, build_launch_spec

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return make_node(tmp_path / "node")


def test_limit_is_hit_exactly(client: Path, node: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB")
    result = run_client(client, env, "alloc", GiB - 4096, "alloc", 4096, "alloc", 1)
    assert codes(result, "alloc") == [0, 0, OOM]
    assert result.gpupool_lines() == [
        f"{result.prefix}out of memory on device 0: 1 GiB used + 1 B asked > limit 1 GiB"
    ]


def test_without_a_limit_the_driver_decides(client: Path, tmp_path: Path) -> None:
    small = make_node(tmp_path / "small", memory=2 * GiB)
    result = run_client(client, shim_env(small), "alloc", GiB, "alloc", 2 * GiB, "meminfo")
    assert codes(result, "alloc") == [0, OOM]
    assert result.step("meminfo") == [[str(GiB), str(2 * GiB)]]
    assert result.gpupool_lines() == []


def test_memory_queries_report_the_share(client: Path, node: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="4GiB")
    result = run_client(client, env, "meminfo", "alloc", GiB, "meminfo", "totalmem")
    assert result.step("meminfo") == [[str(4 * GiB), str(4 * GiB)], [str(3 * GiB), str(4 * GiB)]]
    assert result.step("totalmem") == [[str(4 * GiB)]]


def test_get_proc_address_returns_the_limited_allocator(client: Path, node: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="256MiB")
    result = run_client(client, env, "procalloc", 200 * MiB, "procalloc", 100 * MiB)
    assert codes(result, "procalloc") == [0, OOM]


@pytest.mark.parametrize(
    ("steps", "step"),
    [
        (["alloc", 600 * MiB], "alloc"),
        (["managed", 600 * MiB], "managed"),
        (["async", 600 * MiB], "async"),
        (["vmm", 600 * MiB], "vmm"),
        (["array", 8192, 4800], "array"),  # float4: 16 B x 8192 x 4800 = 600 MiB
        (["array3d", 1024, 1200, 32], "array3d"),  # 16 B x 1024 x 1200 x 32 = 600 MiB
        (["mipmap", 8192, 3600, 8], "mipmap"),  # 450 MiB x (1 + 1/4 + 1/16 + ...) ~ 600 MiB
        (["pool", 600 * MiB], "pool"),
        (["ptszasync", 600 * MiB], "ptszasync"),
    ],
)
def test_every_allocation_kind_counts_and_its_free_credits(
    client: Path, node: Path, steps: list[object], step: str
) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB")
    free = {"async": "freeasync", "pool": "freeasync", "ptszasync": "ptszfree"}.get(step, "free")
    result = run_client(client, env, *steps, *steps, free, *steps)  # type: ignore[arg-type]
    assert codes(result, step) == [0, OOM, 0]
    assert codes(result, free) == [0]


def test_pitched_allocations_count_their_padding(client: Path, node: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB")
    result = run_client(client, env, "pitch", 1000, 1024, "meminfo")
    (pitch_line,) = result.step("pitch")
    assert pitch_line[0] == "0"
    pitch = int(pitch_line[1])
    assert pitch >= 1000
    assert result.step("meminfo") == [[str(GiB - pitch * 1024), str(GiB)]]


def test_python_ctypes_goes_through_dlsym(node: Path) -> None:
    script = (
        "import ctypes\n"
        "cuda = ctypes.CDLL('libcuda.so.1')\n"
        "assert cuda.cuInit(0) == 0\n"
        "ctx = ctypes.c_void_p()\n"
        "assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0\n"
        "assert cuda.cuCtxSetCurrent(ctx) == 0\n"
        "ptr = ctypes.c_ulonglong()\n"
        "print(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 29)))\n"
        "print(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 30)))\n"
        "free, total = ctypes.c_size_t(), ctypes.c_size_t()\n"
        "assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0\n"
        "print(free.value, total.value)\n"
    )
    env = shim_env(node, MEMORY_LIMIT="2GiB")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n")[:3] == ["0", str(OOM), f"{GiB // 2} {2 * GiB}"]


def test_processes_of_one_share_use_one_budget(client: Path, node: Path, tmp_path: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="4GiB", SHARED_REGION=str(tmp_path / "region"))
    holder = start_client(client, env, "alloc", 3 * GiB, "ready")
    try:
        assert read_until(holder, "ready")[0] == ["alloc", "0"]
        second = run_client(client, env, "meminfo", "alloc", 2 * GiB, "alloc", GiB)
        assert second.step("meminfo") == [[str(GiB), str(4 * GiB)]]
        assert codes(second, "alloc") == [OOM, 0]
    finally:
        holder.communicate("go\n", timeout=30)
    # both gone: the whole budget is free again
    third = run_client(client, env, "alloc", 4 * GiB)
    assert codes(third, "alloc") == [0]


def test_racing_allocators_never_pass_the_limit_together(
    client: Path, node: Path, tmp_path: Path
) -> None:
    limit, chunk, racers = GiB, 16 * MiB, 4
    env = shim_env(node, MEMORY_LIMIT=str(limit), SHARED_REGION=str(tmp_path / "region"))
    procs = [start_client(client, env, "ready", "fill", chunk, "ready") for _ in range(racers)]
    try:
        for proc in procs:
            read_until(proc, "ready")
        for proc in procs:  # release them together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        counts = [int(read_until(proc, "ready")[0][1]) for proc in procs]
        state = SimState.open(node / "state.bin")
        try:
            used = state.gpus()[0].memory_used
        finally:
            state.close()
    finally:
        for proc in procs:
            proc.communicate("go\n", timeout=30)
    assert sum(counts) == limit // chunk
    assert used == limit


def test_a_killed_process_gives_its_memory_back(client: Path, node: Path, tmp_path: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="4GiB", SHARED_REGION=str(tmp_path / "region"))
    victim = start_client(client, env, "alloc", 3 * GiB, "hold")
    assert read_until(victim, "holding")[0] == ["alloc", "0"]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    # the next process of the share takes the bytes back when it opens the region
    result = run_client(client, env, "meminfo", "alloc", 3 * GiB, "meminfo")
    assert codes(result, "alloc") == [0]
    assert result.step("meminfo") == [[str(4 * GiB), str(4 * GiB)], [str(GiB), str(4 * GiB)]]


def test_memory_of_a_killed_process_comes_back_when_an_allocation_needs_it(
    client: Path, node: Path, tmp_path: Path
) -> None:
    env = shim_env(node, MEMORY_LIMIT="4GiB", SHARED_REGION=str(tmp_path / "region"))
    survivor = start_client(client, env, "ready", "alloc", 3 * GiB, "ready")
    victim = start_client(client, env, "alloc", 3 * GiB, "hold")
    try:
        read_until(survivor, "ready")  # it opened the region while the victim was alive
        assert read_until(victim, "holding")[0] == ["alloc", "0"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert survivor.stdin is not None
        survivor.stdin.write("go\n")
        survivor.stdin.flush()
        assert read_until(survivor, "ready")[0] == ["alloc", "0"]
    finally:
        survivor.communicate("go\n", timeout=30)


def test_threads_of_one_process_share_the_limit_exactly(client: Path, node: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB")
    result = run_client(client, env, "tfill", 8, 4 * MiB, "meminfo", "alloc", GiB)
    assert result.step("tfill") == [[str(GiB // (4 * MiB)), "0"]]
    assert result.step("meminfo") == [[str(GiB), str(GiB)]]
    assert codes(result, "alloc") == [0]


def test_processes_killed_at_any_moment_leave_the_accounting_whole(
    client: Path, node: Path, tmp_path: Path
) -> None:
    # killed while allocating and freeing, a process may die holding the share's lock: the next
    # one must recover it (robust mutex) and give the dead process's bytes back
    env = shim_env(node, MEMORY_LIMIT="1GiB", SHARED_REGION=str(tmp_path / "region"))
    for round_ in range(12):
        victims = [
            start_client(client, env, "alloc", 256 * MiB, "churn", 64 * MiB) for _ in range(2)
        ]
        for victim in victims:
            read_until(victim, "churning")
        threading.Event().wait(0.005 * (round_ % 4))
        for victim in victims:
            victim.send_signal(signal.SIGKILL)
        for victim in victims:
            victim.communicate(timeout=30)
    result = run_client(client, env, "meminfo", "alloc", GiB, timeout=30)
    assert result.step("meminfo") == [[str(GiB), str(GiB)]]
    assert codes(result, "alloc") == [0]


@pytest.mark.parametrize("teardown", ["ctxdestroy", "reset"])
def test_a_destroyed_context_gives_its_allocations_back(
    client: Path, node: Path, teardown: str
) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB")
    result = run_client(client, env, teardown, 768 * MiB, "meminfo", "alloc", 768 * MiB)
    assert codes(result, teardown) == [0]
    assert result.step("meminfo") == [[str(GiB), str(GiB)]]
    assert codes(result, "alloc") == [0]


def test_a_process_that_execs_starts_afresh(client: Path, node: Path, tmp_path: Path) -> None:
    # same pid, same start time, new image: the old image's allocations are gone with it
    env = shim_env(node, MEMORY_LIMIT="4GiB", SHARED_REGION=str(tmp_path / "region"))
    result = run_client(client, env, "alloc", 3 * GiB, "exec", "meminfo", "alloc", 3 * GiB)
    assert codes(result, "alloc") == [0, 0]
    assert result.step("meminfo") == [[str(4 * GiB), str(4 * GiB)]]


def test_a_later_process_cannot_loosen_the_share(client: Path, node: Path, tmp_path: Path) -> None:
    region = str(tmp_path / "region")
    first = run_client(client, shim_env(node, MEMORY_LIMIT="1GiB", SHARED_REGION=region))
    assert first.returncode == 0
    looser = shim_env(node, MEMORY_LIMIT="64GiB", SHARED_REGION=region)
    result = run_client(client, looser, "alloc", 2 * GiB, "totalmem")
    assert codes(result, "alloc") == [OOM]
    assert result.step("totalmem") == [[str(GiB)]]


def test_the_launch_spec_of_a_share_holds(client: Path, node: Path) -> None:
    limits = ShareLimits(gpus=(0,), memory=512 * MiB)
    spec = build_launch_spec(
        [str(client), "alloc", str(512 * MiB), "alloc", "1"], limits, sim_node=node
    )
    proc = subprocess.run(list(spec.argv), env=dict(spec.env), capture_output=True, text=True)
    assert proc.stdout.split("\n")[:2] == ["alloc 0", f"alloc {OOM}"]


def test_refusals_are_logged_a_few_times_then_counted(client: Path, node: Path) -> None:
    steps: list[str | int] = []
    for _ in range(20):
        steps += ["alloc", 2 * GiB]
    result = run_client(client, shim_env(node, MEMORY_LIMIT="1Gi"), *steps)
    assert codes(result, "alloc") == [OOM] * 20
    lines = result.gpupool_lines()
    refused = [x for x in lines if x.startswith(f"{result.prefix}out of memory on device 0")]
    assert len(refused) == 5
    assert refused[-1].endswith("(further refusals are counted, not logged)")
    assert lines[-1] == f"{result.prefix}20 allocations refused in all, over the memory limit"
    assert len(lines) == 6
