"""Elastic memory below the daemon: the region's elastic part at the C header's offsets, the
simulated driver's host link (copies and managed migrations take the bandwidth's time, managed
memory moves off the GPU and back), and a process suspended and resumed through its region."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from shim_support import PROGS, compile_prog, read_until, shim_env, start_client

from gpupool.core.units import GiB, MiB
from gpupool.devices.sim.spec import HOST_LINKS, NVLINK_C2C, PCIE_GEN4, host_link
from gpupool.devices.sim.state import SimGpuSpec, SimState
from gpupool.isolation import elastic, region

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include "gpupool_region.h"
#define AT(f) printf("%s %zu\n", #f, offsetof(gpupool_region, f))
#define EL(f) printf("%s %zu\n", #f, offsetof(gpupool_region, elastic) + \
                     offsetof(gpupool_region_elastic, f))
int main(void) {
    AT(memory_limit); AT(compute_limit); AT(used); AT(procs); AT(elastic);
    EL(control); EL(control_seq); EL(host_bytes); EL(burst_limit); EL(burst_used);
    EL(burst_device); EL(burst_on_device); EL(ack_seq); EL(ack_state);
    printf("size %zu\nelastic_size %zu\nproc_size %zu\n", sizeof(gpupool_region),
           sizeof(gpupool_region_elastic), sizeof(gpupool_region_proc));
    return 0;
}
"""

#: copies over the host link, timed inside the process (the driver call, nothing else)
LINK = textwrap.dedent(
    """
    import ctypes, sys, time
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()
    size = int(sys.argv[1])
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(size), 1) == 0
    host = ctypes.create_string_buffer(size)
    def timed(call):
        start = time.monotonic()
        assert call() == 0
        assert cuda.cuCtxSynchronize() == 0
        return time.monotonic() - start
    htod = timed(lambda: cuda.cuMemcpyHtoD_v2(ptr, host, ctypes.c_size_t(size)))
    dtod = timed(lambda: cuda.cuMemcpyDtoD_v2(ptr, ptr, ctypes.c_size_t(size)))
    used = ctypes.c_size_t(), ctypes.c_size_t()
    out = timed(lambda: cuda.cuMemPrefetchAsync(ptr, ctypes.c_size_t(size), -1, None))
    cuda.cuMemGetInfo_v2(ctypes.byref(used[0]), ctypes.byref(used[1]))
    free_on_host = used[0].value
    back = timed(lambda: cuda.cuMemPrefetchAsync(ptr, ctypes.c_size_t(size), 0, None))
    cuda.cuMemGetInfo_v2(ctypes.byref(used[0]), ctypes.byref(used[1]))
    print(htod, dtod, out, back, free_on_host, used[0].value)
    """
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_prog(PROGS / "shim_client.c", tmp_path_factory.mktemp("progs") / "shim_client")


def node(directory: Path, bandwidth: int, memory: int = 40 * GiB) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = SimGpuSpec(
        uuid="GPU-00000000-1111-2222-3333-444444444444",
        name="NVIDIA A100-SXM4-40GB",
        model="A100-40GB",
        memory_total=memory,
        sm_count=108,
        cc_major=8,
        cc_minor=0,
        pci_bus_id="00000000:17:00.0",
        host_link_bytes_s=bandwidth,
    )
    SimState.create(directory / "state.bin", [spec]).close()
    return directory


def test_python_reads_the_elastic_part_at_the_c_offsets(tmp_path: Path) -> None:
    source = tmp_path / "layout.c"
    source.write_text(LAYOUT)
    exe = compile_prog(source, tmp_path / "layout")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    c = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()}
    assert (c["memory_limit"], c["compute_limit"]) == (region.LIMITS_OFFSET, 160)
    assert (c["used"], c["procs"]) == (region.USED_OFFSET, region.PROCS_OFFSET)
    assert (c["elastic"], c["elastic_size"]) == (region.ELASTIC_OFFSET, region.ELASTIC_SIZE)
    assert c["size"] == region.FILE_SIZE and c["proc_size"] == region.PROC_SIZE
    base = region.ELASTIC_OFFSET
    assert c["control"] == base and c["control_seq"] == base + 8
    step = 8 * region.DEVICES
    for i, name in enumerate(("host_bytes", "burst_limit", "burst_used", "burst_device")):
        assert c[name] == base + 16 + i * step
    assert c["burst_on_device"] == base + 16 + 4 * step
    assert c["ack_seq"] == base + 16 + 5 * step
    assert c["ack_state"] == c["ack_seq"] + 8 * region.PROCS


def test_every_catalog_model_has_a_host_link() -> None:
    assert host_link("A100-40GB") is PCIE_GEN4
    assert host_link("GH200-96GB") is NVLINK_C2C
    assert all(link.bytes_per_s > 0 for link in HOST_LINKS.values())


@pytest.mark.serial
def test_copies_and_migrations_take_the_host_links_time(tmp_path: Path) -> None:
    size = 256 * MiB
    bandwidth = 1024 * MiB  # 1 GiB/s: 0.25 s a copy
    env = shim_env(node(tmp_path / "node", bandwidth))
    del env["LD_PRELOAD"]  # the driver alone
    answer = subprocess.run(
        [sys.executable, "-c", LINK, str(size)], env=env, capture_output=True, text=True
    )
    assert answer.returncode == 0, answer.stderr
    htod, dtod, out, back, free_on_host, free_back = answer.stdout.split()
    expected = size / bandwidth
    for timed in (htod, out, back):  # never faster than the link; loose above (a loaded host)
        assert expected * 0.95 <= float(timed) < expected * 4
    assert float(dtod) < expected / 4  # on the GPU: no link crossed
    assert int(free_on_host) == 40 * GiB  # on the host, it is off the GPU
    assert int(free_back) == 40 * GiB - size


def test_a_process_suspends_and_resumes_through_its_region(tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    path = share / "region"
    env = shim_env(
        node(tmp_path / "node", 25 * 10**9),
        MEMORY_LIMIT="8Gi",
        ELASTIC="1",
        SHARED_REGION=str(path),
    )
    job = [sys.executable, str(EXAMPLES / "elastic_job.py"), "3", "4096"]
    proc = subprocess.Popen(job, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("holding 4096 MiB")
    state = SimState.open(tmp_path / "node" / "state.bin")
    try:
        before = elastic.read(path)
        assert before is not None and before.used[0] == 4 * GiB
        elastic.request(path, elastic.SUSPEND, before.seq + 1)
        deadline = time.monotonic() + 5
        while not ((now := elastic.read(path)) and now.settled()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert now is not None and now.settled() and now.host_bytes[0] == 4 * GiB
        assert state.gpu(0).memory_used == 0
        elastic.request(path, elastic.RUN, now.seq + 1)
        deadline = time.monotonic() + 5
        while not ((now := elastic.read(path)) and now.settled()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert now is not None and now.settled() and now.host_bytes[0] == 0
        assert state.gpu(0).memory_used == 4 * GiB
    finally:
        state.close()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "intact after" in out


def test_an_idle_process_is_suspended_and_what_is_not_managed_stays(
    tmp_path: Path, client: Path
) -> None:
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    path = share / "region"
    env = shim_env(node(tmp_path / "node", 25 * 10**9), ELASTIC="1", SHARED_REGION=str(path))
    # blocked in pause(): only the library's own thread can carry the request out
    proc = start_client(client, env, "alloc", GiB, "async", 256 * MiB, "hold")
    try:
        read_until(proc, "holding")
        state = SimState.open(tmp_path / "node" / "state.bin")
        before = elastic.read(path)
        assert before is not None
        elastic.request(path, elastic.SUSPEND, before.seq + 1)
        deadline = time.monotonic() + 5
        while not ((now := elastic.read(path)) and now.settled()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert now is not None and now.settled() and now.host_bytes[0] == GiB
        assert state.gpu(0).memory_used == 256 * MiB  # a pool allocation is not managed memory
        state.close()
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "suspended; 256 MiB stay on the GPU (not managed memory" in err
