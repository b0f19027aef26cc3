"""A request loop for the MPS priority checks: one kernel per request, timed from launch to done.

It talks to the driver through ctypes (libcuda.so.1), so it needs no CUDA toolkit; on a real GPU
the image has no such kernel, so it runs on a simulated node only (bench/gpu/modes.py times
PyTorch on a GPU). Usage:
    request_loop.py SECONDS BLOCKS [THREADS]
Each request is one kernel of BLOCKS blocks of THREADS threads (default 128; 256 blocks of 128:
1 ms on a whole simulated GPU), then a synchronize. Prints one line:
RESULT {"requests", "rate", "p50_ms", "p99_ms"}.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def main(argv: list[str]) -> int:
    seconds, blocks = float(argv[1]), int(argv[2])
    threads = int(argv[3]) if len(argv) > 3 else 128
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, module, function = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuModuleLoadData(ctypes.byref(module), b"no device code\0") == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(function), module, b"request") == 0
    latencies = []
    start = time.perf_counter()
    while (began := time.perf_counter()) - start < seconds:
        rc = cuda.cuLaunchKernel(function, blocks, 1, 1, threads, 1, 1, 0, None, None, None)
        if rc != 0 or cuda.cuCtxSynchronize() != 0:
            print(f"launch failed: CUDA error {rc}", flush=True)
            return 3
        latencies.append((time.perf_counter() - began) * 1000)
    latencies.sort()
    result = {
        "requests": len(latencies),
        "rate": len(latencies) / (time.perf_counter() - start),
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
