"""The simulated CUDA driver on its own: real processes (a C probe) on a simulated node."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.core.units import GiB
from gpupool.devices.sim.node import SimNode
from gpupool.devices.sim.spec import parse_spec
from gpupool.devices.sim.state import FLAG_LOST, SimProcSlot, SimState
from gpupool.isolation.libraries import native_libraries

ROOT = Path(__file__).resolve().parents[2]
PROBE_SOURCE = ROOT / "tests" / "native" / "progs" / "sim_probe.c"
SMOKE_SOURCE = ROOT / "tests" / "native" / "progs" / "sim_smoke.c"
KERNEL_NS = 256 * 128 * 30518 // 1000  # 256 blocks x 128 threads at the default ps per thread

Record = dict[str, str]


def create_sim_node(spec: str, node_dir: Path) -> SimState:
    """A simulated node made as `gpupool exec` and `gpupool gpus` make it; its state, mapped."""
    return SimNode.open_or_create(parse_spec(spec), node_dir).state


@pytest.fixture(scope="session")
def sim_dir() -> Path:
    """Builds the simulated driver (incrementally) and returns the directory of libcuda.so.1."""
    libs = native_libraries()
    target = os.path.relpath(libs.sim_driver, ROOT / "native")
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), target], check=True)
    return libs.sim_dir


@pytest.fixture(scope="session")
def probe(sim_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("probe") / "sim_probe"
    subprocess.run(
        [
            *("gcc", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'native' / 'include'}"),
            *("-o", str(exe), str(PROBE_SOURCE), f"-L{sim_dir}", "-l:libcuda.so.1", "-ldl"),
        ],
        check=True,
    )
    return exe


def sim_env(sim_dir: Path, node: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "CUDA_"))}
    env["LD_LIBRARY_PATH"] = str(sim_dir)
    if node is not None:
        env["GPUPOOL_SIM_NODE"] = str(node)
    env.update(extra)
    return env


def parse(stdout: str) -> list[Record]:
    """`kind k=v k=v ...` lines; a `name=` value runs to the end of its line."""
    records = []
    for line in stdout.splitlines():
        kind, _, rest = line.partition(" ")
        record = {"kind": kind}
        head, sep, name = rest.partition(" name=")
        if not sep and rest.startswith("name="):
            head, name, sep = "", rest[5:], "="
        for pair in head.split():
            key, _, value = pair.partition("=")
            record[key] = value
        if sep:
            record["name"] = name
        records.append(record)
    return records


def run_probe(
    probe: Path, sim_dir: Path, node: Path | None, *args: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(probe), *args],
        env=sim_env(sim_dir, node, **extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def records(result: subprocess.CompletedProcess[str], kind: str) -> list[Record]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [r for r in parse(result.stdout) if r["kind"] == kind]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, SimState]]:
    node_dir = tmp_path / "node"
    state = create_sim_node("1xA30", node_dir)
    yield node_dir, state
    state.close()


def test_enumerates_the_node_s_gpus(probe: Path, sim_dir: Path, tmp_path: Path) -> None:
    state = create_sim_node("1xA100-40GB,1xH100", tmp_path)
    devs = records(run_probe(probe, sim_dir, tmp_path, "enum"), "dev")
    assert [d["name"] for d in devs] == ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"]
    assert [int(d["total"]) for d in devs] == [g.memory_total for g in state.gpus()]
    capabilities = [(d["sm"], d["major"], d["minor"]) for d in devs]
    assert capabilities == [("108", "8", "0"), ("132", "9", "0")]
    assert {d["warp"] for d in devs} == {"32"} and {d["maxthreads"] for d in devs} == {"1024"}
    assert [d["uuid"] for d in devs] == [g.uuid[4:].replace("-", "") for g in state.gpus()]
    assert devs[0]["pci"] == state.gpu(0).pci_bus_id[4:]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", ["H100"]),
        ("1,0", ["H100", "A100"]),
        ("0,7,1", ["A100"]),  # the list ends at the first invalid entry
        ("0,0", ["A100"]),  # and at a repeated one
        ("UUID1", ["H100"]),
        ("", []),
    ],
)
def test_cuda_visible_devices(
    probe: Path, sim_dir: Path, tmp_path: Path, visible: str, expected: list[str]
) -> None:
    state = create_sim_node("1xA100-40GB,1xH100", tmp_path)
    visible = visible.replace("UUID1", state.gpu(1).uuid[:12])  # a unique UUID prefix
    result = run_probe(probe, sim_dir, tmp_path, "enum", CUDA_VISIBLE_DEVICES=visible)
    if not expected:
        assert records(result, "init") == [{"kind": "init", "rc": "100"}]
        return
    names = [d["name"] for d in records(result, "dev")]
    assert [n.split()[1].split("-")[0] for n in names] == expected


def test_without_a_node_cuinit_says_what_to_set(probe: Path, sim_dir: Path) -> None:
    # started by hand, not by run_probe: the line carries the probe's pid
    with subprocess.Popen(
        [str(probe), "enum"],
        env=sim_env(sim_dir, None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        stdout, stderr = proc.communicate(timeout=60)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert records(result, "init") == [{"kind": "init", "rc": "100"}]
    assert stderr.count("\n") == 1
    assert stderr.startswith(
        f"gpupool[{proc.pid}]: simulated driver: GPUPOOL_SIM_NODE is not set: set it to "
    )


def test_a_file_that_is_not_a_node_state_is_refused(
    probe: Path, sim_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "state.bin").write_bytes(b"\0" * 100)
    result = run_probe(probe, sim_dir, tmp_path, "enum")
    assert records(result, "init") == [{"kind": "init", "rc": "100"}]
    assert "not a gpupool simulated node state" in result.stderr


def test_memory_is_counted_per_process_and_oom_at_the_gpu_size(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    sizes = [10 * GiB, 15 * GiB, 14 * GiB]  # the second passes 24 GiB, the third fills it exactly
    proc = subprocess.Popen(
        [str(probe), "alloc", *map(str, sizes)],
        env=sim_env(sim_dir, node_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    lines = []
    while not (line := proc.stdout.readline()).startswith("ready"):
        lines.append(line)
    allocs = [r for r in parse("".join(lines)) if r["kind"] == "alloc"]
    assert [a["rc"] for a in allocs] == ["0", "2", "0"]
    held = next(r for r in parse("".join(lines)) if r["kind"] == "meminfo")
    assert (int(held["free"]), int(held["total"])) == (0, 24 * GiB)
    slots = list(state.procs())
    assert [(s.pid, s.gpu, s.memory_used) for s in slots] == [(proc.pid, 0, 24 * GiB)]
    assert state.gpu(0).memory_used == 24 * GiB
    out, _ = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0
    freed = [r for r in parse(out) if r["kind"] == "meminfo"]
    assert int(freed[0]["free"]) == 24 * GiB
    assert state.gpu(0).memory_used == 0
    assert list(state.procs(live_only=False)) == []  # the slot is given back at exit


def test_racing_processes_cannot_pass_the_gpu_memory_together(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    sizes = [str(GiB)] * 10
    procs = [
        subprocess.Popen(
            [str(probe), "alloc", *sizes],
            env=sim_env(sim_dir, node_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    granted = 0
    for proc in procs:
        assert proc.stdout is not None
        while not (line := proc.stdout.readline()).startswith("ready"):
            granted += line.startswith("alloc") and line.rstrip().endswith("rc=0")
    assert granted == 24  # 40 GiB asked for at once on a 24 GiB GPU: exactly 24 granted
    assert sum(slot.memory_used for slot in state.procs()) == 24 * GiB == state.gpu(0).memory_used
    for proc in procs:
        proc.communicate("go\n", timeout=30)
    assert state.gpu(0).memory_used == 0


def test_vmm_arrays_and_pitch_are_counted(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, _ = node
    result = run_probe(probe, sim_dir, node_dir, "vmm")
    info = {r["tag"]: 24 * GiB - int(r["free"]) for r in records(result, "meminfo")}
    vmm_size = 16 * 2 * 1024**2
    assert info["created"] == vmm_size
    assert info["released-still-mapped"] == vmm_size  # memory goes back once also unmapped
    assert info["unmapped"] == 0
    arrays = 1024 * 1024 * 16 + 64**3 + (64**3 + 32**3)  # 2D float4, 3D u8, 2-level mipmap
    assert info["arrays"] == arrays
    assert info["arrays-destroyed"] == 0
    assert info["pools"] == 8 * 1024**2
    assert info["pools-freed"] == 0
    assert records(result, "pool")[0]["destroy_default_rc"] == "1"
    assert info["pitched"] == 1024 * 10
    assert records(result, "vmm")[0] == {"kind": "vmm", "gran": "2097152", "word": "01020304"}
    assert records(result, "pitch")[0]["value"] == "1024"
    errors = records(result, "vmmerr")[0]
    assert (errors["outside"], errors["twice"], errors["free_mapped"]) == ("1", "208", "1")


def test_kernel_time_is_proportional_to_threads(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    run = records(run_probe(probe, sim_dir, node_dir, "kernels", "20", "256", "128"), "kernels")[0]
    # between events: the kernels' time, plus any gap where a loaded host launched late (2 %)
    assert float(run["event_ms"]) == pytest.approx(20 * KERNEL_NS / 1e6, rel=0.02)
    assert float(run["queued_ms"]) < 10  # launches are asynchronous
    assert float(run["wall_ms"]) >= 20
    assert (run["query_rc"], run["stream_query_rc"], run["after_rc"]) == ("600", "600", "0")
    assert state.gpu(0).busy_ns_total == 20 * KERNEL_NS
    half = records(run_probe(probe, sim_dir, node_dir, "kernels", "4", "128", "128"), "kernels")
    assert float(half[0]["event_ms"]) == pytest.approx(2.0, rel=0.02)


def test_kernel_time_override(probe: Path, sim_dir: Path, node: tuple[Path, SimState]) -> None:
    node_dir, _ = node
    result = run_probe(
        probe, sim_dir, node_dir, "kernels", "4", "256", "128", GPUPOOL_SIM_KERNEL_NS="5000000"
    )
    assert float(records(result, "kernels")[0]["event_ms"]) == pytest.approx(20.0, abs=0.01)
    bad = run_probe(probe, sim_dir, node_dir, "enum", GPUPOOL_SIM_KERNEL_NS="5ms")
    assert records(bad, "init") == [{"kind": "init", "rc": "1"}]
    assert "GPUPOOL_SIM_KERNEL_NS=5ms" in bad.stderr


def test_two_processes_take_turns_on_one_gpu(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    args = [str(probe), "kernels", "200", "256", "128"]  # 200 ms alone
    env = sim_env(sim_dir, node_dir)
    started = time.monotonic()
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=30)[0] for p in procs]
    both_done_ms = (time.monotonic() - started) * 1e3
    runs = [next(r for r in parse(o) if r["kind"] == "kernels") for o in outs]
    assert state.gpu(0).busy_ns_total == 400 * KERNEL_NS
    # one kernel at a time: the two finish no sooner than the sum of their work
    assert both_done_ms >= 400 * KERNEL_NS / 1e6
    # and whoever queued second waited behind the other's kernels
    assert max(float(r["event_ms"]) for r in runs) > 200 * KERNEL_NS / 1e6 + 50


def test_events_order_streams(probe: Path, sim_dir: Path, node: tuple[Path, SimState]) -> None:
    node_dir, _ = node
    run = records(run_probe(probe, sim_dir, node_dir, "streams"), "streams")[0]
    assert float(run["waited_ms"]) == pytest.approx(20 * KERNEL_NS / 1e6, abs=0.01)
    assert run["no_timing_rc"] == "400"  # an event made with CU_EVENT_DISABLE_TIMING


def test_graphs_replay_their_kernels_and_captured_work(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, _ = node
    manual, captured, library = records(run_probe(probe, sim_dir, node_dir, "graph"), "graph")
    assert float(library["event_ms"]) == pytest.approx(3 * KERNEL_NS / 1e6, abs=0.01)
    assert float(manual["event_ms"]) == pytest.approx(3 * KERNEL_NS / 1e6, abs=0.01)
    assert float(captured["event_ms"]) == pytest.approx(2 * KERNEL_NS / 1e6, abs=0.01)
    assert captured["capturing"] == "1"
    # the fill captured in the graph happens when the graph runs, not when it is captured
    assert (captured["before"], captured["after"]) == ("0", "7")


def test_get_proc_address_answers_by_base_name_and_version(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, _ = node
    result = run_probe(probe, sim_dir, node_dir, "procaddr")
    lookups = {(r["sym"], r.get("v", "")): r for r in records(result, "lookup")}
    assert lookups[("cuMemAlloc", "12040")] == {
        "kind": "lookup",
        "sym": "cuMemAlloc",
        "v": "12040",
        "same": "1",
        "status": "0",
    }
    assert lookups[("cuMemAlloc", "3000")]["status"] == "2"  # version not sufficient
    assert lookups[("cuNoSuchFunction", "")]["status"] == "1"
    assert lookups[("cuNoSuchFunction", "")]["rc"] == "500"
    assert lookups[("cuLaunchKernel", "")]["ptsz"] == "1"
    assert lookups[("cuLaunchKernel", "6050")]["legacy"] == "1"
    assert lookups[("cuLaunchKernel", "7000")]["ptsz"] == "1"
    assert lookups[("cuGetProcAddress", "")]["v2"] == "1"
    assert lookups[("cuGraphInstantiate", "")]["withflags"] == "1"
    assert records(result, "call")[0]["rc"] == "0"
    errors = records(result, "errors")[0]
    assert (errors["err"], errors["version"]) == ("CUDA_ERROR_OUT_OF_MEMORY", "12040")
    assert records(result, "errtext")[0]["name"] == "out of memory"


def test_pinned_memory_pointer_queries_and_kernel_attributes(
    probe: Path, sim_dir: Path, tmp_path: Path
) -> None:
    total = create_sim_node("2xH100", tmp_path).gpu(0).memory_total
    result = run_probe(probe, sim_dir, tmp_path, "extras")
    assert int(records(result, "meminfo")[0]["free"]) == total - 2**20
    pointers = records(result, "pointers")[0]
    assert pointers == {
        "kind": "pointers",
        "dev": "2",  # CU_MEMORYTYPE_DEVICE, found from an interior pointer
        "host": "1",  # pinned
        "registered": "1",
        "ordinal": "0",
        "owner_is_current": "1",
        "range_ok": "1",
        "unknown_rc": "1",  # memory the driver never saw
    }
    assert records(result, "freeing")[0] == {
        "kind": "freeing",
        "free_again_rc": "1",
        "unregister_again_rc": "713",
    }
    assert records(result, "misc")[0] == {
        "kind": "misc",
        "least": "0",
        "greatest": "-5",
        "peer01": "1",
        "peer00": "0",
        "maxthreads": "1024",
        "blocks": "8",  # 2048 threads per SM / 256
        "blocks_smem": "2",  # 228 KiB of shared memory per SM / 100000 bytes
        "coop_ok": "0",
        "coop_big": "720",  # one block more than 132 SMs x 8 can hold at once
    }


def test_contexts_push_pop_and_destroy_frees_memory(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, _ = node
    result = run_probe(probe, sim_dir, node_dir, "contexts")
    ctx = {k: v for r in records(result, "ctx") for k, v in r.items()}
    assert ctx["no_ctx_rc"] == "201"  # CUDA_ERROR_INVALID_CONTEXT without a current context
    assert ctx["created_current"] == ctx["popped_created"] == ctx["primary_current"] == "1"
    assert ctx["after_destroy_primary"] == "1"
    assert ctx["pinned_gone_rc"] == "1"  # the context's pinned memory went with it
    info = {r["tag"]: int(r["free"]) for r in records(result, "meminfo")}
    assert info["created-alloc"] == 23 * GiB
    assert info["destroyed"] == 24 * GiB


def _start_holder(probe: Path, sim_dir: Path, node_dir: Path, size: int) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [str(probe), "hold", str(size)],
        env=sim_env(sim_dir, node_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("ready")
    return holder


def test_a_killed_process_s_memory_is_reclaimed(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    holder = _start_holder(probe, sim_dir, node_dir, 20 * GiB)
    (slot,) = state.procs()
    assert (slot.pid, slot.memory_used, slot.busy_ns) == (holder.pid, 20 * GiB, KERNEL_NS)
    assert slot.last_launch_ns <= time.monotonic_ns()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert state.gpu(0).memory_used == 20 * GiB  # nobody has looked yet
    assert list(state.procs()) == []  # readers skip the dead slot
    result = run_probe(probe, sim_dir, node_dir, "rc")
    assert records(result, "alloc")[0]["rc"] == "0"
    assert list(state.procs(live_only=False)) == []
    assert state.gpu(0).memory_used == 0


def test_after_exec_the_slot_holds_only_the_new_image_s_memory(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    # exec keeps the pid and its start time, so the new image finds the old image's slot
    proc = subprocess.Popen(
        [str(probe), "exec", str(10 * GiB), str(GiB)],
        env=sim_env(sim_dir, node_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    try:
        assert lines[2].startswith("ready"), lines
        info = {r["tag"]: int(r["free"]) for r in parse("".join(lines)) if r["kind"] == "meminfo"}
        assert info == {"new-image": 24 * GiB, "new-image-alloc": 23 * GiB}
        (slot,) = state.procs()
        assert (slot.pid, slot.memory_used, slot.busy_ns) == (proc.pid, GiB, 0)
        assert state.gpu(0).memory_used == GiB
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert list(state.procs(live_only=False)) == [] and state.gpu(0).memory_used == 0


def test_a_slot_whose_pid_was_reused_is_reclaimed(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, state = node
    # a live pid, but the start time of a process that is gone: the pid was reused
    stale = SimProcSlot(0, os.getpid(), 0, 1, 24 * GiB, 5, 6)
    state.write_proc(0, stale)
    state.set_gpu_usage(0, memory_used=24 * GiB, busy_ns_total=0)
    assert list(state.procs()) == []
    result = run_probe(probe, sim_dir, node_dir, "rc")
    assert records(result, "alloc")[0]["rc"] == "0"
    assert list(state.procs(live_only=False)) == []
    assert state.gpu(0).memory_used == 0


def test_a_child_forked_after_cuinit_cannot_use_cuda(
    probe: Path, sim_dir: Path, node: tuple[Path, SimState]
) -> None:
    node_dir, _ = node
    result = run_probe(probe, sim_dir, node_dir, "fork")
    child = records(result, "child")[0]
    assert (child["init_rc"], child["alloc_rc"], child["free_rc"]) == ("3", "3", "3")
    assert int(records(result, "meminfo")[0]["free"]) == 23 * GiB  # the parent's GiB stays


def test_a_lost_gpu_fails_calls(probe: Path, sim_dir: Path, node: tuple[Path, SimState]) -> None:
    node_dir, state = node
    state.set_flags(0, FLAG_LOST)
    result = run_probe(probe, sim_dir, node_dir, "rc")
    assert records(result, "init")[0]["rc"] == "0"
    assert records(result, "retain")[0]["rc"] == "46"  # CUDA_ERROR_DEVICE_UNAVAILABLE
    assert records(result, "alloc")[0]["rc"] == "201"  # no context could be made


def test_the_c_smoke_program_runs(sim_dir: Path, tmp_path: Path) -> None:
    exe = tmp_path / "sim_smoke"
    subprocess.run(["gcc", "-o", str(exe), str(SMOKE_SOURCE), "-ldl"], check=True)
    create_sim_node("1xH100", tmp_path / "node")
    result = subprocess.run(
        [str(exe)],
        env=sim_env(sim_dir, tmp_path / "node"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "GPU 0: NVIDIA H100 80GB HBM3, 81559 MiB" in result.stdout  # as NVIDIA's driver says
    assert "copy round trip: ok" in result.stdout
    # ten 1 ms kernels: the simulated time is a floor, the host's scheduling only adds to it
    [elapsed] = re.findall(r"10 kernels of 256x128 threads: ([0-9.]+) ms", result.stdout)
    assert 10.0 <= float(elapsed) < 11.0, result.stdout


def test_calls_before_cuinit_are_refused(sim_dir: Path) -> None:
    driver = ctypes.CDLL(str(sim_dir / "libcuda.so.1"))
    count = ctypes.c_int(-1)
    assert driver.cuDeviceGetCount(ctypes.byref(count)) == 3  # CUDA_ERROR_NOT_INITIALIZED
    version = ctypes.c_int(0)
    assert driver.cuDriverGetVersion(ctypes.byref(version)) == 0
    assert version.value == 12040
    name = ctypes.c_char_p()
    assert driver.cuGetErrorName(46, ctypes.byref(name)) == 0
    assert name.value == b"CUDA_ERROR_DEVICE_UNAVAILABLE"
