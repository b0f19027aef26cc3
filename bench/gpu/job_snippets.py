"""Pieces of job scripts that several GPU checks run through the daemon, as Python source.

A check writes its job as one script (the daemon runs it in its own process, under the job's
share), so what the checks share is source text joined into that script, not functions.

The fill pair: `TORCH_FILL` on a real GPU, `CTYPES_FILL` its dry-run twin on the simulated
driver. Each needs `limit` (the job's memory share in bytes) and fills the share less 256 MiB
(the headroom PyTorch's own allocations need), then asks for 512 MiB more; it leaves `filled`
(bytes held) and `past` ("OutOfMemoryError" when the cap held, else "allocated").
"""

from __future__ import annotations

#: a 4096^2 matmul's tensors `a`, `b`, `c`, warmed up (10 products), torch imported
TORCH_MATMUL = """
import torch
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
c = torch.empty_like(a)
for _ in range(10):
    torch.mm(a, b, out=c)
torch.cuda.synchronize()
"""

#: the fill on a real GPU, in 512 MiB tensors kept in `chunks`, counting what PyTorch has
#: reserved already
TORCH_FILL = """
import torch
chunks = []
filled = torch.cuda.memory_reserved()
while filled < limit - 256 * 2**20:
    size = min(512 * 2**20, limit - 256 * 2**20 - filled)
    chunks.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
    filled += size
try:
    chunks.append(torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda"))
    past = "allocated"
except torch.cuda.OutOfMemoryError:
    past = "OutOfMemoryError"
"""

#: `cuda` (the driver, real or simulated) with GPU 0's primary context current, and `ptr`
CTYPES_CONTEXT = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr = ctypes.c_void_p(), ctypes.c_ulonglong()
assert cuda.cuInit(0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
"""

#: the fill through the driver API, after `CTYPES_CONTEXT` (2: CUDA_ERROR_OUT_OF_MEMORY)
CTYPES_FILL = """
filled = limit - 256 * 2**20
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(filled)) == 0
rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(512 * 2**20))
past = "OutOfMemoryError" if rc == 2 else "allocated"
"""
