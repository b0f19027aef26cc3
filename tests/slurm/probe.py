"""What a Slurm job sees of its GPU, for tests/slurm: `probe.py MIB [SECONDS]`.

Prints `total=BYTES` (the device total CUDA reports), then `alloc=ok` or `alloc=oom` for an
allocation of MIB, then, with SECONDS, `kernels=N` launched back to back in that time.
"""

from __future__ import annotations

import ctypes
import sys
import time

MIB = 1 << 20


def main(argv: list[str]) -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    print(f"total={total.value}", flush=True)
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(argv[1]) * MIB))
    print("alloc=ok" if rc == 0 else f"alloc=oom rc={rc}", flush=True)
    if len(argv) > 2:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        assert cuda.cuModuleLoadData(ctypes.byref(module), b"sim\0") == 0
        assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"workload") == 0
        launched, end = 0, time.monotonic() + float(argv[2])
        while time.monotonic() < end:
            cuda.cuLaunchKernel(function, 256, 1, 1, 128, 1, 1, 0, None, None, None)
            cuda.cuCtxSynchronize()
            launched += 1
        print(f"kernels={launched}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
