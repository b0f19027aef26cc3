"""A job for bench/elastic_memory.py: `grow MIB` retries an allocation until the share lets it
through and prints when; `rate SECONDS` launches 1 ms kernels and prints its launches every
0.25 s. Times are CLOCK_MONOTONIC, comparable with the benchmark's own."""

from __future__ import annotations

import ctypes
import sys
import time

MIB = 1 << 20


def main(argv: list[str]) -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    if argv[1] == "grow":
        print("trying", flush=True)
        while cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(argv[2]) * MIB)) != 0:
            time.sleep(0.001)
        print(f"grown {time.monotonic()}", flush=True)
        return 0
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(module), b"no device code in a simulation\0") == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"k") == 0
    end = time.monotonic() + float(argv[2])
    launches, next_print = 0, 0.0
    while (now := time.monotonic()) < end:
        cuda.cuLaunchKernel(function, 256, 1, 1, 128, 1, 1, 0, None, None, None)
        launches += 1
        if now >= next_print:
            print(f"at {now} {launches}", flush=True)
            next_print = now + 0.25
    cuda.cuCtxSynchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
