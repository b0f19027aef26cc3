"""The router's parsing cost alone, in memory: a small JSON answer read by llhttp and relayed
(router_answer.Answer, as for every request), and a client's request head parsed
(router_http.parse_head). No sockets: what the parser and its callbacks cost per request, which
the router's overhead at 500 req/s (bench/inference_pool.py --only router) holds with the rest.
Usage:

    python bench/router_parse.py [--count N]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gpupool.api import router_http
from gpupool.api.router_answer import Answer

ANSWER = (
    b"HTTP/1.1 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.7\r\n"
    b"Date: Sat, 28 Nov 2026 16:00:00 GMT\r\nContent-Type: application/json\r\n"
    b'Content-Length: 15\r\n\r\n{"port": 12345}'
)
REQUEST = b"GET /svc/ping HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*\r\nUser-Agent: x\r\n\r\n"


class Sink:
    """A client connection that takes everything at once."""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass


async def one_answer() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(ANSWER)
    answer = Answer(reader, head_only=False)
    sink = Sink()
    await answer.head(sink)  # type: ignore[arg-type]
    await answer.relay(sink)  # type: ignore[arg-type]


async def measure(count: int) -> tuple[float, float]:
    for _ in range(count // 10):  # warm up
        await one_answer()
    began = time.perf_counter()
    for _ in range(count):
        await one_answer()
    answer_us = (time.perf_counter() - began) / count * 1e6
    began = time.perf_counter()
    for _ in range(count):
        router_http.parse_head(REQUEST)
    return answer_us, (time.perf_counter() - began) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    args = parser.parse_args()
    answer_us, head_us = asyncio.run(measure(args.count))
    print(f"answer read and relayed: {answer_us:.1f} us; request head parsed: {head_us:.1f} us")


if __name__ == "__main__":
    main()
