"""The router's parsing cost alone, in memory: a small JSON answer read by llhttp and relayed
(router_answer.Answer, as for every request), and a client's request read from its connection
by llhttp (router_body.Requests: a GET's head, and a POST's head with its small JSON body). No
sockets: what the parser and its callbacks cost per request, which the router's overhead at
500 req/s (bench/inference_pool.py --only router) holds with the rest.
Usage:

    python bench/router_parse.py [--count N]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from gpupool.api.router_answer import Answer
from gpupool.api.router_body import Requests

ANSWER = (
    b"HTTP/1.1 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.7\r\n"
    b"Date: Sat, 28 Nov 2026 16:00:00 GMT\r\nContent-Type: application/json\r\n"
    b'Content-Length: 15\r\n\r\n{"port": 12345}'
)
REQUEST = b"GET /svc/ping HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*\r\nUser-Agent: x\r\n\r\n"
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(CHAT), CHAT)
)


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


class Connection:
    """A client connection as the router reads it: one parser, requests one after the other."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()
        self.requests = Requests(self.reader)

    async def one(self, data: bytes) -> None:
        """A request read as the router reads it: its head, then its body."""
        self.reader.feed_data(data)
        await self.requests.head()
        await self.requests.body()


async def per_call_us(count: int, call: Callable[[], Awaitable[object]]) -> float:
    for _ in range(count // 10):  # warm up
        await call()
    began = time.perf_counter()
    for _ in range(count):
        await call()
    return (time.perf_counter() - began) / count * 1e6


async def measure(count: int) -> dict[str, float]:
    kept = Connection()

    async def opened() -> Connection:
        return Connection()

    return {
        "answer": await per_call_us(count, one_answer),
        "get": await per_call_us(count, lambda: kept.one(REQUEST)),
        "post": await per_call_us(count, lambda: kept.one(POST)),
        "open": await per_call_us(count, opened),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    args = parser.parse_args()
    us = asyncio.run(measure(args.count))
    print(
        f"answer read and relayed: {us['answer']:.1f} us; request read on a kept-alive "
        f"connection: GET {us['get']:.1f} us, POST with a {len(CHAT)}-byte JSON body "
        f"{us['post']:.1f} us; a new connection's parser: {us['open']:.1f} us"
    )


if __name__ == "__main__":
    main()
