"""A small model server for gpupool services on a simulated node (tests and `make demo`).

It is a real share of a GPU: at start it loads its "weights" (device memory it holds, through
the interception library's limits), and each request runs kernels on its GPU through the CUDA
driver API (ctypes, libcuda.so.1: the simulated driver on a simulated node), so services that
share a GPU slow each other as they would on a real one. It serves HTTP/1.1 on $PORT:

    GET /health               200 once loaded
    POST|GET /infer           KERNELS kernels of BLOCKS blocks of THREADS, then {"port", "pid",
                              "ms"}
                              (?kernels=N&delay=S: other counts, and S seconds held first)
    GET /stream?tokens=N      server-sent events, one event per "token" (one kernel each),
                              each one sent as its own chunk the moment it is made
    GET /ping                 no GPU work (the router's overhead is measured against it)

Usage: model_server.py [--memory-mib N] [--load-s S] [--blocks B] [--threads T] [--kernels K]

A kernel's time on a whole simulated GPU follows its threads (256 blocks of 128: 1 ms); its
blocks say how many SMs it can fill, which matters under MPS: a grid of fewer blocks than the
GPU has SMs (a batch-1 inference kernel: e.g. --blocks 16 --threads 1024, 0.5 ms on 16 SMs) is
not slowed by an active thread percentage above the part it fills.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MIB = 1 << 20


class Gpu:
    """The driver, a context and a kernel; one launch at a time per calling thread."""

    def __init__(self, memory_mib: int) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.ctx, module, self.function = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        assert self.cuda.cuInit(0) == 0
        assert self.cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0) == 0
        assert self.cuda.cuCtxSetCurrent(self.ctx) == 0
        weights = ctypes.c_ulonglong()
        rc = self.cuda.cuMemAlloc_v2(ctypes.byref(weights), ctypes.c_size_t(memory_mib * MIB))
        if rc != 0:
            raise SystemExit(f"cannot load {memory_mib} MiB of weights: CUDA error {rc}")
        assert self.cuda.cuModuleLoadData(ctypes.byref(module), b"no device code\0") == 0
        assert self.cuda.cuModuleGetFunction(ctypes.byref(self.function), module, b"infer") == 0
        self._local = threading.local()

    def run(self, kernels: int, blocks: int, threads: int) -> None:
        if not getattr(self._local, "current", False):
            self.cuda.cuCtxSetCurrent(self.ctx)  # a context is current per thread
            self._local.current = True
        for _ in range(kernels):
            rc = self.cuda.cuLaunchKernel(
                self.function, blocks, 1, 1, threads, 1, 1, 0, None, None, None
            )
            if rc != 0 or self.cuda.cuCtxSynchronize() != 0:
                raise RuntimeError(f"kernel launch failed: CUDA error {rc}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # the head and the body go in separate writes: without this, Nagle's algorithm and the
    # peer's delayed ACK hold the body back 40 ms
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # a line per request would fill the job's log

    def _json(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/health":
            self._json(200 if self.server.loaded.is_set() else 503, {"ok": True})
        elif url.path == "/ping":
            self._json(200, {"port": self.server.port})
        elif url.path == "/infer":
            self._infer(query)
        elif url.path == "/stream":
            self._stream(int(query.get("tokens", "8")))
        else:
            self._json(404, {"error": "NotFound", "message": f"no route {url.path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        url = urlsplit(self.path)
        if url.path == "/infer":
            self._infer({k: v[-1] for k, v in parse_qs(url.query).items()})
        else:
            self._json(404, {"error": "NotFound", "message": f"no route {url.path}"})

    def _infer(self, query: dict[str, str]) -> None:
        began = time.perf_counter()
        time.sleep(float(query.get("delay", "0")))
        kernels = int(query.get("kernels", self.server.kernels))
        self.server.gpu.run(kernels, self.server.blocks, self.server.threads)
        ms = (time.perf_counter() - began) * 1000
        self._json(200, {"port": self.server.port, "pid": os.getpid(), "ms": round(ms, 3)})

    def _stream(self, tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n in range(tokens):
            self.server.gpu.run(1, self.server.blocks, self.server.threads)
            event = f"data: token {n} {time.time():.6f}\n\n".encode()
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
            time.sleep(self.server.token_s)
        self.wfile.write(b"0\r\n\r\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, port: int, args: argparse.Namespace) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.port = port
        self.loaded = threading.Event()
        self.blocks, self.threads = args.blocks, args.threads
        self.kernels, self.token_s = args.kernels, args.token_s
        self.gpu: Gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--memory-mib", type=int, default=512, help="Weights held on the GPU.")
    parser.add_argument("--load-s", type=float, default=0.0, help="Extra seconds to load.")
    parser.add_argument("--blocks", type=int, default=256, help="Blocks per kernel (256: 1 ms).")
    parser.add_argument("--threads", type=int, default=128, help="Threads per block.")
    parser.add_argument("--kernels", type=int, default=4, help="Kernels per /infer request.")
    parser.add_argument("--token-s", type=float, default=0.0, help="Pause between tokens.")
    args = parser.parse_args()
    server = Server(int(os.environ["PORT"]), args)  # listening at once: health says when ready
    server.gpu = Gpu(args.memory_mib)
    time.sleep(args.load_s)
    server.loaded.set()
    server.serve_forever()


if __name__ == "__main__":
    main()
