"""The native libraries under AddressSanitizer and UndefinedBehaviorSanitizer.

`make -C native sanitize` builds the libraries and the arbiter with the sanitizers into
build/sanitize/. The C test programs, built with them too, drive the libraries through the paths
the other native tests take: the simulated driver alone (sim_probe; MIG instances, MPS clients),
the interception library's memory hooks and accounting, its launch hooks, throttle and arbiter
client (shim_client, request_loop) with the trusted arbiter (gpupool-arbiterd) itself, its NVML
hooks (shim_nvml_direct), and its configuration errors. Python is not built with the
sanitizers, so no Python process loads these libraries here (one can, with the ASan runtime
preloaded and leak checks off, but the C programs keep leak checks and cover every hook).

Any report fails: an error or undefined behaviour ends the process at once
(-fno-sanitize-recover), a leak is reported at its exit (LeakSanitizer), with the exit status
REPORTED and the report on stderr.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from shim_support import PROGS, Result, codes, compile_prog, gpu_uuid, make_node, shim_env

from gpupool.core.errors import DeviceError
from gpupool.core.units import GiB, MiB
from gpupool.devices.sim import mps_twin
from gpupool.devices.sim.node import SimNode
from gpupool.devices.sim.spec import parse_spec
from gpupool.isolation.arbiter import view_file
from gpupool.isolation.arbiter_control import (
    ArbiterControl,
    ArbiterShare,
    Registration,
    prepare_dir,
)
from gpupool.isolation.libraries import NativeLibraries

REPO = Path(__file__).resolve().parents[2]
# as `make -C native sanitize` builds the libraries
SANITIZE = (
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
)
REPORTED = 86
# what each runtime writes at the head of a report
MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


@dataclass(frozen=True)
class Sanitized:
    libs: NativeLibraries
    asan_runtime: Path
    progs: Path

    def prog(self, name: str) -> Path:
        return self.progs / name

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with the sanitized libraries in place of the built ones, and the runtimes'
        options: the ASan runtime preloaded first, as it must come before any instrumented
        library."""
        env = dict(base)
        if "LD_PRELOAD" in env:
            env["LD_PRELOAD"] = f"{self.asan_runtime} {self.libs.shim}"
        env["LD_LIBRARY_PATH"] = str(self.libs.sim_dir)
        env["ASAN_OPTIONS"] = f"detect_leaks=1:exitcode={REPORTED}"
        env["UBSAN_OPTIONS"] = f"print_stacktrace=1:halt_on_error=1:exitcode={REPORTED}"
        return env


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Sanitized:
    runtime = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(runtime).is_absolute(), "gcc has no AddressSanitizer runtime (Debian: libasan8)"
    subprocess.run(["make", "-s", "-C", str(REPO / "native"), "sanitize"], check=True)
    libs = NativeLibraries(REPO / "build" / "sanitize")
    progs = tmp_path_factory.mktemp("sanitized")
    compile_prog(PROGS / "shim_client.c", progs / "shim_client", *SANITIZE)
    driver = (f"-L{libs.sim_dir}", "-l:libcuda.so.1")
    compile_prog(PROGS / "sim_probe.c", progs / "sim_probe", *SANITIZE, *driver)
    compile_prog(PROGS / "request_loop.c", progs / "request_loop", *SANITIZE, *driver)
    nvml = ("-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1")
    compile_prog(PROGS / "shim_fake_nvml.c", progs / "libnvidia-ml.so.1", *SANITIZE, *nvml)
    compile_prog(
        PROGS / "shim_nvml_direct.c",
        progs / "nvml_direct",
        *SANITIZE,
        f"-L{progs}",
        "-l:libnvidia-ml.so.1",
    )
    return Sanitized(libs, Path(runtime), progs)


def clean(result: Result) -> Result:
    """`result`, having checked that no sanitizer reported anything."""
    reports = [line for line in result.stderr if any(m in line for m in MARKERS)]
    assert result.returncode != REPORTED and not reports, "\n".join(result.stderr)
    return result


def start(command: Sequence[str | Path | int], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(c) for c in command],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> Result:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    lines = [line.split() for line in stdout.splitlines()]
    return clean(Result(proc.pid, proc.returncode, lines, stderr.splitlines()))


def run(command: Sequence[str | Path | int], env: Mapping[str, str]) -> Result:
    return finish(start(command, env))


@contextmanager
def killed_after(procs: list[subprocess.Popen[str]]) -> Iterator[None]:
    """None of `procs` left running after the block, whatever fails in it."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return make_node(tmp_path / "node")


def probe_env(sanitized: Sanitized, node: Path, **extra: str) -> dict[str, str]:
    env = sanitized.env(shim_env(node))
    del env["LD_PRELOAD"]  # the driver alone
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "verb",
    [
        ["enum"],
        ["alloc", str(GiB), str(100 * GiB), str(MiB)],
        ["vmm"],
        ["kernels", "8", "256", "128"],
        ["graph"],
        ["procaddr"],
        ["contexts"],
        ["streams"],
        ["rc"],
        ["fork"],
        ["extras"],
        ["exec", str(GiB), str(MiB)],
    ],
    ids=lambda verb: verb[0],
)
def test_the_simulated_driver(sanitized: Sanitized, tmp_path: Path, verb: list[str]) -> None:
    node = make_node(tmp_path / "node", gpus=2)  # `extras` needs two, for peer access
    result = run([sanitized.prog("sim_probe"), *verb], probe_env(sanitized, node))
    assert result.returncode == 0, result.stderr


def test_the_simulated_driver_s_mig_instances(sanitized: Sanitized, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("gpus:\n  - model: H100\n    mig: [1g.10gb, 3g.40gb]\n")
    mig = SimNode.open_or_create(parse_spec(str(spec)), tmp_path / "node")
    uuid = mig.gpu(0).instances[0].uuid
    mig.close()
    env = probe_env(sanitized, tmp_path / "node", CUDA_VISIBLE_DEVICES=uuid)
    for verb in (["enum"], ["kernels", "4", "256", "128"], ["alloc", str(20 * GiB)]):
        assert run([sanitized.prog("sim_probe"), *verb], env).returncode == 0


def test_the_simulated_driver_s_mps_clients(
    sanitized: Sanitized, node: Path, tmp_path: Path
) -> None:
    dirs = {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
    }
    twin = mps_twin.command()
    assert subprocess.run([*twin, "-d"], env=dict(os.environ, **dirs), timeout=30).returncode == 0
    try:
        kernels = ["kernels", "8", "256", "128"]
        for percent, pinned in (("30", "0=1G"), ("100", "0=10M")):
            env = probe_env(
                sanitized,
                node,
                **dirs,
                CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=percent,
                CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=pinned,
            )
            assert run([sanitized.prog("sim_probe"), *kernels], env).returncode == 0
            assert run([sanitized.prog("sim_probe"), "alloc", str(GiB)], env).returncode == 0
        bad = probe_env(sanitized, node, **dirs, CUDA_MPS_CLIENT_PRIORITY="x" * 5000)
        refused = run([sanitized.prog("sim_probe"), "enum"], bad)
        assert refused.stderr[0].startswith(f"{refused.prefix}simulated driver: ")
    finally:
        subprocess.run(twin, input="quit\n", text=True, env=dict(os.environ, **dirs), timeout=30)


def test_memory_hooks_and_accounting(sanitized: Sanitized, node: Path, tmp_path: Path) -> None:
    env = sanitized.env(shim_env(node, MEMORY_LIMIT="2GiB", SHARED_REGION=str(tmp_path / "region")))
    steps = [
        *("alloc", MiB, "procalloc", 4096, "managed", 4096, "pitch", 1024, 64),
        *("async", 4096, "vmm", 2 * MiB, "array", 64, 64, "array3d", 16, 16, 16),
        *("mipmap", 64, 64, 3, "pool", 4096, "ptszasync", 4096),
        *("free", "freeasync", "ptszfree", "meminfo", "totalmem", "exporttable"),
        *("ctxdestroy", 64 * 1024, "reset", 64 * 1024, "fill", 256 * MiB, "tfill", 4, 64 * MiB),
        *("alloc", 3 * GiB),
    ]
    result = run([sanitized.prog("shim_client"), *steps], env)
    assert result.returncode == 0, result.stderr
    assert codes(result, "alloc") == [0, OOM]
    assert (
        result.stderr[-1] == f"{result.prefix}6 allocations refused in all, over the memory limit"
    )
    # apart: the new image's exit is the only one LeakSanitizer sees
    image = run([sanitized.prog("shim_client"), "alloc", MiB, "exec", "alloc", MiB], env)
    assert codes(image, "alloc") == [0, 0]
    # a second process of the share, and one killed holding memory: the region reclaims it
    held = start([sanitized.prog("shim_client"), "alloc", GiB, "hold"], env)
    with killed_after([held]):
        assert held.stdout is not None and held.stdout.readline().split() == ["alloc", "0"]
        beside = run([sanitized.prog("shim_client"), "alloc", 2 * GiB, "alloc", 512 * MiB], env)
        assert codes(beside, "alloc") == [OOM, 0]
        held.send_signal(signal.SIGKILL)
        held.communicate()
    after = run([sanitized.prog("shim_client"), "alloc", int(1.5 * GiB)], env)
    assert codes(after, "alloc") == [0]


def test_launch_hooks_and_the_throttle(sanitized: Sanitized, node: Path) -> None:
    env = sanitized.env(shim_env(node, COMPUTE_LIMIT="30", LOG_LEVEL="debug"))
    kinds = ["kernel", "ex", "coop", "graph", "procgraph", "nocurrent"]
    steps = [x for kind in kinds for x in ("run", 0.2, kind)]
    result = run([sanitized.prog("shim_client"), *steps], env)
    assert result.returncode == 0, result.stderr
    assert len(result.step("run")) == len(kinds)
    assert result.gpupool_lines()[-1].startswith(f"{result.prefix}launches seen: ")


def _sanitized_arbiter(sanitized: Sanitized, directory: Path) -> subprocess.Popen[str]:
    """The sanitized gpupool-arbiterd in `directory`, once its control socket answers."""
    prepare_dir(directory)
    env = sanitized.env({"PATH": os.environ["PATH"]})
    proc = start([sanitized.libs.root / "gpupool-arbiterd", directory], env)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            ArbiterControl(directory, timeout_s=1).close()
            return proc
        except DeviceError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the sanitized arbiter did not start: {proc.communicate()[1]}")


def test_the_arbiter_with_shares_and_priorities(
    sanitized: Sanitized, node: Path, tmp_path: Path
) -> None:
    """The sanitized arbiter and library: capped, share, low and high shares busy together, one
    killed holding or asking for its lease, garbage on the lease channel, a foreign view."""
    directory = tmp_path / "arbiter"
    daemon = _sanitized_arbiter(sanitized, directory)
    control = ArbiterControl(directory)
    uuid = gpu_uuid(node)

    def share(
        name: str, percent: int = 100, policy: str = "cap", slice_us: int = 0, **settings: str
    ) -> dict[str, str]:
        arbiter = ArbiterShare.new()
        priority = settings.get("COMPUTE_PRIORITY")
        terms = Registration(arbiter, os.getuid(), (uuid,), percent, priority, policy, slice_us)
        control.register(terms)
        named = {"ARBITER_DIR": str(directory), "ARBITER_SHARE": arbiter.setting, **settings}
        if percent < 100:
            named.update(COMPUTE_LIMIT=str(percent), COMPUTE_POLICY=policy)
        return sanitized.env(shim_env(node, SHARED_REGION=str(tmp_path / name), **named))

    client = sanitized.prog("shim_client")
    busy = [
        start([client, "run", 1, "kernel"], share("a", 30)),
        start([client, "run", 1, "kernel"], share("b", 70, "share")),
        start([client, "run", 1.5, "kernel"], share("low", COMPUTE_PRIORITY="low")),
        start([client, "run", 30, "kernel"], share("doomed", 50)),
    ]
    # two latency-bound high shares with short slices among them, one busy, one a request at a
    # time with gaps between
    online = share("busy-high", slice_us=2000, COMPUTE_PRIORITY="high")
    busy.insert(-1, start([client, "run", 1, "kernel"], online))
    with killed_after([*busy, daemon]):
        online = share("high", slice_us=2000, COMPUTE_PRIORITY="high")
        service = run([sanitized.prog("request_loop"), 1, 20, 64, 5000], online)
        assert int(service.step("requests")[0][0]) > 0
        busy[-1].send_signal(signal.SIGKILL)  # killed holding or asking for the lease
        busy[-1].communicate()
        for blob in (b"x", os.urandom(48), os.urandom(4000)):
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.connect(str(directory / "lease.sock"))
                sock.send(blob)
        for proc in busy[:-1]:
            assert finish(proc).returncode == 0
        after = run([client, "run", 0.3, "kernel"], share("after", 50))
        assert after.returncode == 0, after.stderr
        view = view_file(directory, uuid)
        forged = view.with_name("forged")
        forged.write_bytes(b"\xff" * view.stat().st_size)
        forged.replace(view)
        alone = run([client, "run", 0.3, "kernel"], share("alone", 50))
        assert alone.returncode == 0 and len(alone.gpupool_lines()) == 1, alone.stderr
        control.close()
        daemon.send_signal(signal.SIGTERM)
        ended = finish(daemon)
    assert ended.returncode == 0, ended.stderr


def test_nvml_hooks(sanitized: Sanitized, tmp_path: Path) -> None:
    uuids = ("GPU-00000000-1111-2222-3333-444444444444", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    node = make_node(tmp_path / "node", gpus=2, uuids=uuids)
    env = sanitized.env(shim_env(node, MEMORY_LIMIT="2GiB"))
    env["LD_LIBRARY_PATH"] += f":{sanitized.progs}"
    env["CUDA_VISIBLE_DEVICES"] = "0"
    result = run([sanitized.prog("nvml_direct")], env)
    assert result.lines[0] == ["0", str(2 * GiB), "0", str(2 * GiB)]


@pytest.mark.parametrize(
    "setting",
    [
        {"MEMORY_LIMIT": "18446744073709551616"},
        {"MEMORY_LIMIT": "17179869184Gi"},
        {"MEMORY_LIMIT": "99999999999999999999999Ei"},
        {"MEMORY_LIMIT": "9223372036854775807m"},
        {"MEMORY_LIMIT": "-1"},
        {"MEMORY_LIMIT": "1.5Gi"},
        {"MEMORY_LIMIT_99999999999": "1Gi"},
        {"COMPUTE_LIMIT": "4294967396"},
        {"COMPUTE_POLICY": "x" * 5000},  # a line longer than the log's buffer
        {"ARBITER_DIR": "/" + "d" * 5000},
        {"SHARED_REGION": "/" + "r" * 5000},
    ],
    ids=lambda setting: next(iter(setting)),
)
def test_bad_settings_stop_the_workload(
    sanitized: Sanitized, node: Path, setting: dict[str, str]
) -> None:
    env = sanitized.env(shim_env(node, **setting))
    result = run([sanitized.prog("shim_client"), "alloc", 1], env)
    assert result.returncode == 2 and len(result.stderr) == 1
    assert result.stderr[0].startswith(result.prefix)


def test_the_simulated_driver_s_complaints(sanitized: Sanitized, tmp_path: Path) -> None:
    env = probe_env(sanitized, tmp_path / ("n" * 5000))  # longer than its line
    result = run([sanitized.prog("sim_probe"), "enum"], env)
    assert result.lines[0] == ["init", "rc=100"]
    assert result.stderr[0].startswith(f"{result.prefix}simulated driver: ")


def test_corrupt_files_stop_the_workload(sanitized: Sanitized, node: Path, tmp_path: Path) -> None:
    client = sanitized.prog("shim_client")
    region = tmp_path / "region"
    region.write_bytes(b"not a region")
    env = sanitized.env(shim_env(node, SHARED_REGION=str(region)))
    assert run([client, "alloc", 1], env).returncode == 2
    conf = tmp_path / "shim.conf"
    conf.write_bytes(b"GPUPOOL_MEMORY_LIMIT=1GiB\n" + b"#" * 10000 + b"\nGPUPOOL_X\n")
    env = sanitized.env(shim_env(node, CONFIG_FILE=str(conf)))
    assert run([client, "alloc", 1], env).returncode == 2


@pytest.mark.parametrize(
    ("fault", "report"),
    [
        (
            'char *p = malloc(8); memset(p, 1, 8 + argc); printf("%d\\n", p[0]); free(p);',
            "heap-buffer-overflow",
        ),
        ('int x = INT_MAX; x += argc; printf("%d\\n", x);', "signed integer overflow"),
        ("(void)argc; sink = malloc(100); sink = NULL;", "detected memory leaks"),
    ],
    ids=["overflow", "undefined", "leak"],
)
def test_a_sanitizer_report_fails_the_check(
    sanitized: Sanitized, tmp_path: Path, fault: str, report: str
) -> None:
    # the check itself: what a sanitizer finds in a program built as the test programs are
    source = tmp_path / "fault.c"
    headers = "".join(f"#include <{h}.h>\n" for h in ("limits", "stdio", "stdlib", "string"))
    source.write_text(
        f"{headers}static void *volatile sink;\n"
        f"int main(int argc, char **argv) {{ (void)argv; {fault} return 0; }}\n"
    )
    program = compile_prog(source, tmp_path / "fault", *SANITIZE)
    with pytest.raises(AssertionError, match=report):
        run([program], sanitized.env({}))
