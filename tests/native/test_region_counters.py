"""The share's counters in its accounting region: Python (gpupool.isolation.region) reads them at
the C header's offsets (native/include/gpupool_region.h), and real processes on the simulated
driver add to them: refused allocations, time slept for the cap, time waited for the lease."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest
from shim_support import (
    INCLUDE,
    PROGS,
    Result,
    arbiter,
    codes,
    compile_prog,
    gpu_uuid,
    make_node,
    register,
    run_client,
    shim_env,
)

from gpupool.core.errors import ConfigError
from gpupool.core.units import GiB
from gpupool.isolation import region

OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY

LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include "gpupool_region.h"
#define COUNTER(f) printf("counters.%s %zu %zu\n", #f, offsetof(gpupool_region_counters, f), \
                          sizeof(((gpupool_region_counters *)0)->f))
int main(void) {
    printf("magic %llu\nversion %u\ndevices %d\n", (unsigned long long)GPUPOOL_REGION_MAGIC,
           GPUPOOL_REGION_VERSION, GPUPOOL_REGION_DEVICES);
    printf("size %zu\ncounters %zu\n", sizeof(gpupool_region), offsetof(gpupool_region, counters));
    printf("version_at %zu\nsize_at %zu\nshare_id_at %zu\n", offsetof(gpupool_region, version),
           offsetof(gpupool_region, size), offsetof(gpupool_region, share_id));
    COUNTER(refused); COUNTER(cap_wait_ns); COUNTER(lease_wait_ns);
    printf("counters.size %zu\n", sizeof(gpupool_region_counters));
    return 0;
}
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


def test_python_reads_the_region_at_the_c_offsets(tmp_path: Path) -> None:
    source = tmp_path / "layout.c"
    source.write_text(LAYOUT)
    exe = compile_prog(source, tmp_path / "layout")
    assert INCLUDE.is_dir()
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    c = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in out.splitlines()}
    assert c["magic"] == [region.MAGIC]
    assert c["version"] == [region.VERSION]
    assert c["devices"] == [region.DEVICES]
    assert c["size"] == [region.FILE_SIZE]
    assert c["counters"] == [region.COUNTERS_OFFSET]
    # HEADER: magic, version, size, share_id
    assert (c["version_at"], c["size_at"], c["share_id_at"]) == ([8], [12], [16])
    assert c["counters.size"] == [region.COUNTERS.size]
    offset = 0
    for name in ("refused", "cap_wait_ns", "lease_wait_ns"):
        assert c[f"counters.{name}"] == [offset, 8], name
        offset += 8


def test_refused_allocations_are_counted_for_the_whole_share(client: Path, tmp_path: Path) -> None:
    node = make_node(tmp_path / "node")
    path = tmp_path / "region"
    env = shim_env(node, MEMORY_LIMIT="1GiB", SHARED_REGION=str(path))
    first = run_client(client, env, "alloc", 2 * GiB, "alloc", GiB // 2, "alloc", GiB)
    second = run_client(client, env, "alloc", 2 * GiB)
    assert codes(first, "alloc") == [OOM, 0, OOM]
    assert codes(second, "alloc") == [OOM]
    counters = region.read_counters(path)
    assert counters is not None
    assert counters[0].refused_allocations == 3
    assert (counters[0].cap_wait_seconds, counters[0].lease_wait_seconds) == (0.0, 0.0)
    assert all(c.refused_allocations == 0 for c in counters[1:])


def test_time_slept_for_the_cap_is_counted(client: Path, tmp_path: Path) -> None:
    node = make_node(tmp_path / "node")
    path = tmp_path / "region"
    env = shim_env(node, COMPUTE_LIMIT="30", SHARED_REGION=str(path))
    result = run_client(client, env, "run", 1.0, "kernel")
    assert result.returncode == 0, result.stderr
    counters = region.read_counters(path)
    assert counters is not None
    # alone at 30 %: about 70 % of the second is slept (the first burst is free)
    assert 0.4 <= counters[0].cap_wait_seconds <= 1.0, counters[0]
    assert counters[0].lease_wait_seconds < 0.05, counters[0]
    assert counters[0].refused_allocations == 0


def test_time_waited_for_the_lease_is_counted(client: Path, tmp_path: Path) -> None:
    node = make_node(tmp_path / "node")
    paths = [tmp_path / "region-a", tmp_path / "region-b"]
    results: list[Result] = []

    def one(path: Path, arbitrated: dict[str, str]) -> None:
        env = shim_env(
            node,
            COMPUTE_LIMIT="50",
            COMPUTE_POLICY="share",
            SHARED_REGION=str(path),
            **arbitrated,
        )
        results.append(run_client(client, env, "run", 1.0, "kernel"))

    with arbiter(tmp_path / "arbiter") as (control, _pid):
        names = [register(control, gpu_uuid(node), 50, "share") for _ in paths]
        workers = [
            threading.Thread(target=one, args=(path, name))
            for path, name in zip(paths, names, strict=True)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    for path in paths:
        counters = region.read_counters(path)
        assert counters is not None
        # two busy halves of one GPU: each waits for the other's lease about half the time
        assert 0.2 <= counters[0].lease_wait_seconds <= 1.0, counters[0]
        assert counters[0].cap_wait_seconds == 0.0  # `share` has no cap to sleep for


def test_a_missing_region_reads_as_none_and_another_version_is_refused(tmp_path: Path) -> None:
    assert region.read_counters(tmp_path / "none") is None
    other = tmp_path / "other"
    other.write_bytes(region.HEADER.pack(region.MAGIC, 2, region.FILE_SIZE, 7).ljust(4096, b"\0"))
    with pytest.raises(ConfigError, match="not a gpupool shared region of this version"):
        region.read_counters(other)
    other.write_bytes(b"short")
    with pytest.raises(ConfigError, match="not a gpupool shared region of this version"):
        region.read_counters(other)
    other.write_bytes(bytes(region.FILE_SIZE))  # sized by its first process, not yet written
    assert region.read_counters(other) is None
