"""A small CUDA job for the pool demo and tests: holds memory, computes for a while, exits.

It talks to the driver through ctypes (libcuda.so.1: the real driver on a GPU, the simulated one
on a simulated node), so it needs no CUDA toolkit. Usage:
    cuda_job.py SECONDS [HOLD_MIB] [EXTRA_MIB]
It holds HOLD_MIB, then asks for EXTRA_MIB more (an allocation past its share gets CUDA's
out-of-memory error: the job then exits 2), and launches kernels for SECONDS.
"""

from __future__ import annotations

import ctypes
import sys
import time

CUDA_ERROR_OUT_OF_MEMORY = 2
MIB = 1 << 20


def main(argv: list[str]) -> int:
    seconds = float(argv[1]) if len(argv) > 1 else 2.0
    hold = int(argv[2]) if len(argv) > 2 else 256
    extra = int(argv[3]) if len(argv) > 3 else 0
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(hold * MIB))
    if rc != 0:
        print(f"could not hold {hold} MiB: CUDA error {rc}", flush=True)
        return 2
    print(f"holding {hold} MiB", flush=True)
    if extra:
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(extra * MIB))
        if rc == CUDA_ERROR_OUT_OF_MEMORY:
            print(f"{extra} MiB more: CUDA_ERROR_OUT_OF_MEMORY", flush=True)
            return 2
        print(f"{extra} MiB more: ok", flush=True)
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    image = b"not a real cubin: the simulation runs no device code\0"
    launched = 0
    if cuda.cuModuleLoadData(ctypes.byref(module), image) == 0 and (
        cuda.cuModuleGetFunction(ctypes.byref(function), module, b"workload") == 0
    ):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cuda.cuLaunchKernel(function, 256, 1, 1, 128, 1, 1, 0, None, None, None)
            cuda.cuCtxSynchronize()
            launched += 1
    else:  # a real GPU has no "workload" kernel in that image: just hold the memory
        time.sleep(seconds)
    print(f"done: {launched} kernels in {seconds:g} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
