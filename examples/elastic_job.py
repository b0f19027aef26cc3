"""A CUDA job that checks its own memory, for elastic memory's demo, tests and benchmark.

It holds HOLD_MIB of device memory, writes a pattern into it (one 4 KiB stamp every STRIDE), then
launches kernels for SECONDS; every CHECK_S it reads the stamps back and checks them, so a job
suspended and resumed underneath it says whether its data and addresses survived. With BURST_MIB
it then asks for that much more (past its share: its burst). Usage:
    elastic_job.py SECONDS HOLD_MIB [BURST_MIB]
Prints "holding N MiB at 0xADDR", then "intact after N checks, L launches" and exits 0, or
"CORRUPT ..." and exits 3. It talks to libcuda.so.1 through ctypes: no CUDA toolkit needed.
"""

from __future__ import annotations

import ctypes
import sys
import time

MIB = 1 << 20
STAMP = 4096
STRIDE = 64 * MIB
CHECK_S = 0.1


def _stamp(at: int) -> bytes:
    return (at.to_bytes(8, "little") * (STAMP // 8))[:STAMP]


def main(argv: list[str]) -> int:
    seconds = float(argv[1])
    hold = int(argv[2])
    burst = int(argv[3]) if len(argv) > 3 else 0
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, base = ctypes.c_void_p(), ctypes.c_ulonglong()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    rc = cuda.cuMemAlloc_v2(ctypes.byref(base), ctypes.c_size_t(hold * MIB))
    if rc != 0:
        print(f"could not hold {hold} MiB: CUDA error {rc}", flush=True)
        return 2
    offsets = range(0, hold * MIB - STAMP + 1, STRIDE)
    for offset in offsets:
        data = _stamp(base.value + offset)
        assert cuda.cuMemcpyHtoD_v2(ctypes.c_ulonglong(base.value + offset), data, STAMP) == 0
    print(f"holding {hold} MiB at {base.value:#x}", flush=True)
    if burst:
        extra = ctypes.c_ulonglong()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(extra), ctypes.c_size_t(burst * MIB))
        print(f"burst {burst} MiB: {'ok' if rc == 0 else f'CUDA error {rc}'}", flush=True)
        if rc != 0:
            return 2
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    image = b"not a real cubin: the simulation runs no device code\0"
    assert cuda.cuModuleLoadData(ctypes.byref(module), image) == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"workload") == 0
    buf = ctypes.create_string_buffer(STAMP)
    checks = launches = 0
    end = time.monotonic() + seconds
    next_check = 0.0
    while time.monotonic() < end:
        cuda.cuLaunchKernel(function, 16, 1, 1, 128, 1, 1, 0, None, None, None)
        cuda.cuCtxSynchronize()
        launches += 1
        if time.monotonic() < next_check:
            continue
        next_check = time.monotonic() + CHECK_S
        for offset in offsets:
            at = base.value + offset
            if cuda.cuMemcpyDtoH_v2(buf, ctypes.c_ulonglong(at), STAMP) != 0:
                print(f"CORRUPT: cannot read {at:#x}", flush=True)
                return 3
            if buf.raw != _stamp(at):
                print(f"CORRUPT: the stamp at {at:#x} changed", flush=True)
                return 3
        checks += 1
    print(f"intact after {checks} checks, {launches} launches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
