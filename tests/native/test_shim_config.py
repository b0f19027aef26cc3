"""The interception library's configuration: accepted forms, bad input, the shared region file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from shim_support import (
    PROGS,
    codes,
    compile_prog,
    log_prefix,
    make_node,
    run_client,
    shim_env,
)

from gpupool.core.units import GiB, MiB


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("progs") / "shim_client"
    return compile_prog(PROGS / "shim_client.c", out)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return make_node(tmp_path / "node", memory=80 * GiB)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", GiB),
        ("1GiB", GiB),
        ("1Gi", GiB),
        ("1G", 10**9),  # Kubernetes quantity rules: G is 10^9, Gi is 2^30
        ("1GB", 10**9),
        ("1 Gi", GiB),
        ("512MiB", 512 * MiB),
        ("512Mi", 512 * MiB),
        ("512M", 512 * 10**6),
        ("2048Ki", 2 * MiB),
        ("2048k", 2048 * 1000),
        ("1000000B", 10**6),
        ("1T", 80 * GiB),  # more than the GPU: clamped (and warned, see below)
    ],
)
def test_memory_limit_forms(client: Path, node: Path, text: str, expected: int) -> None:
    result = run_client(client, shim_env(node, MEMORY_LIMIT=text), "totalmem")
    assert result.returncode == 0
    assert result.step("totalmem") == [[str(expected)]]


def test_a_share_larger_than_the_gpu_is_clamped_with_a_warning(client: Path, node: Path) -> None:
    result = run_client(client, shim_env(node, MEMORY_LIMIT="100GiB"), "meminfo", "alloc", 81 * GiB)
    assert result.step("meminfo") == [[str(80 * GiB), str(80 * GiB)]]
    assert codes(result, "alloc") == [2]
    warnings = [line for line in result.gpupool_lines() if "more than the GPU has" in line]
    assert warnings == [
        f"{result.prefix}memory limit 100 GiB on device 0 is more than the GPU has (80 GiB); "
        "using 80 GiB"
    ]


def test_a_per_device_limit_overrides_the_all_device_one(client: Path, node: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB", MEMORY_LIMIT_0="2GiB")
    assert run_client(client, env, "totalmem").step("totalmem") == [[str(2 * GiB)]]


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("MEMORY_LIMIT", "4QB", "invalid GPUPOOL_MEMORY_LIMIT=4QB"),
        ("MEMORY_LIMIT", "-1", "invalid GPUPOOL_MEMORY_LIMIT=-1"),
        ("MEMORY_LIMIT", "1gb", "invalid GPUPOOL_MEMORY_LIMIT=1gb"),  # case-sensitive
        ("MEMORY_LIMIT", "2048K", "invalid GPUPOOL_MEMORY_LIMIT=2048K"),  # kilo is k, kibi Ki
        ("MEMORY_LIMIT", "512m", "invalid GPUPOOL_MEMORY_LIMIT=512m"),  # milli: bytes are whole
        ("MEMORY_LIMIT", "1GiBB", "invalid GPUPOOL_MEMORY_LIMIT=1GiBB"),
        ("MEMORY_LIMIT", "1.5Gi", "invalid GPUPOOL_MEMORY_LIMIT=1.5Gi"),
        ("MEMORY_LIMIT", "17179869184Ei", "invalid GPUPOOL_MEMORY_LIMIT=17179869184Ei"),
        ("MEMORY_LIMIT", "99999999999999999999", "invalid GPUPOOL_MEMORY_LIMIT=9999"),
        ("MEMORY_LIMIT_0", "lots", "invalid GPUPOOL_MEMORY_LIMIT_0=lots"),
        ("MEMORY_LIMIT_X", "1GiB", "invalid variable GPUPOOL_MEMORY_LIMIT_X"),
        ("MEMORY_LIMIT_99", "1GiB", "invalid GPUPOOL_MEMORY_LIMIT_99"),
        ("COMPUTE_LIMIT", "0", "invalid GPUPOOL_COMPUTE_LIMIT=0"),
        ("COMPUTE_LIMIT", "150", "invalid GPUPOOL_COMPUTE_LIMIT=150"),
        ("COMPUTE_LIMIT", "half", "invalid GPUPOOL_COMPUTE_LIMIT=half"),
        ("COMPUTE_LIMIT_1", "2.5", "invalid GPUPOOL_COMPUTE_LIMIT_1=2.5"),
        ("COMPUTE_LIMIT", "1.0", "invalid GPUPOOL_COMPUTE_LIMIT=1.0"),  # a percent, not a GPU
        ("COMPUTE_LIMIT", "99.9", "invalid GPUPOOL_COMPUTE_LIMIT=99.9"),
        ("COMPUTE_POLICY", "greedy", "invalid GPUPOOL_COMPUTE_POLICY=greedy"),
        ("COMPUTE_PRIORITY", "urgent", "invalid GPUPOOL_COMPUTE_PRIORITY=urgent"),
        ("LOG_LEVEL", "loud", "invalid GPUPOOL_LOG_LEVEL=loud"),
        ("ARBITER_DIR", "relative/dir", "invalid GPUPOOL_ARBITER_DIR=relative/dir"),
    ],
)
def test_a_malformed_value_stops_the_workload_with_one_line(
    client: Path, node: Path, name: str, value: str, says: str
) -> None:
    result = run_client(client, shim_env(node, **{name: value}), "alloc", 1)
    assert result.returncode == 2
    assert result.lines == []  # it never ran
    assert len(result.stderr) == 1
    assert result.stderr[0].startswith(f"{result.prefix}{says}")


def test_any_program_stops_not_only_cuda_ones(node: Path) -> None:
    env = shim_env(node, COMPUTE_LIMIT="101")
    with subprocess.Popen(["true"], env=env, stderr=subprocess.PIPE, text=True) as proc:
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert stderr == (
        f"{log_prefix(proc.pid)}invalid GPUPOOL_COMPUTE_LIMIT=101: expected a whole percent "
        "from 1 to 100\n"
    )


def test_a_program_without_cuda_runs_untouched(node: Path, tmp_path: Path) -> None:
    env = shim_env(node, MEMORY_LIMIT="1GiB", SHARED_REGION=str(tmp_path / "region"))
    proc = subprocess.run(["sh", "-c", "echo hi"], env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hi\n", "")


def test_an_unwritable_region_is_a_clear_error(client: Path, node: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "region"
    result = run_client(client, shim_env(node, SHARED_REGION=str(missing)), "alloc", 1)
    assert result.returncode == 2
    assert result.stderr == [
        f"{result.prefix}cannot open the shared region GPUPOOL_SHARED_REGION={missing}: "
        "No such file or directory"
    ]


def test_a_region_path_that_cannot_be_written_is_a_clear_error(
    client: Path, node: Path, tmp_path: Path
) -> None:
    # a directory cannot be opened for writing, whoever runs the test (root included)
    result = run_client(client, shim_env(node, SHARED_REGION=str(tmp_path)), "alloc", 1)
    assert result.returncode == 2
    assert result.stderr == [
        f"{result.prefix}cannot open the shared region GPUPOOL_SHARED_REGION={tmp_path}: "
        "Is a directory"
    ]


def test_a_file_that_is_not_a_region_is_refused(client: Path, node: Path, tmp_path: Path) -> None:
    region = tmp_path / "region"
    region.write_bytes(b"not a region")
    result = run_client(client, shim_env(node, SHARED_REGION=str(region)), "alloc", 1)
    assert result.returncode == 2
    assert len(result.stderr) == 1
    assert "is not a gpupool shared region" in result.stderr[0]


def test_a_configuration_file_overrides_the_environment(
    client: Path, node: Path, tmp_path: Path
) -> None:
    # how a container pins a share: the file (read-only there) wins over anything in the env
    conf = tmp_path / "shim.conf"
    conf.write_text("# the share\nGPUPOOL_MEMORY_LIMIT=1GiB\n\nGPUPOOL_COMPUTE_POLICY=cap\n")
    env = shim_env(node, MEMORY_LIMIT="64GiB", CONFIG_FILE=str(conf))
    result = run_client(client, env, "totalmem", "alloc", 2 * GiB)
    assert result.step("totalmem") == [[str(GiB)]]
    assert codes(result, "alloc") == [2]


def test_a_malformed_configuration_file_stops_the_workload(
    client: Path, node: Path, tmp_path: Path
) -> None:
    conf = tmp_path / "shim.conf"
    conf.write_text("GPUPOOL_MEMORY_LIMIT=1GiB\nmemory: 4GiB\n")
    result = run_client(client, shim_env(node, CONFIG_FILE=str(conf)), "alloc", 1)
    assert result.returncode == 2
    assert result.stderr == [
        f"{result.prefix}invalid line 2 of {conf}: expected GPUPOOL_NAME=VALUE"
    ]
