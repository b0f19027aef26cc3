"""A load generator for HTTP services: Poisson arrivals (open loop) or back-to-back (closed loop).

Open loop: requests arrive at RATE per second with exponential gaps whatever the answers take,
as independent users do, and each one's latency counts from its arrival (so a queue shows).
Closed loop: CONNECTIONS clients send one request after another (a throughput ceiling). It
speaks HTTP/1.1 over kept-alive connections with asyncio streams, so one process drives a
thousand requests a second. Usage:

    loadgen.py URL [--rate R | --closed N] [--seconds S]

prints one line: RESULT {"sent", "statuses", "rate", "p50_ms", "p90_ms", "p99_ms", "max_ms"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)  # seconds, of 2xx answers
    statuses: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    def summary(self) -> dict[str, object]:
        sent = sum(self.statuses.values())
        return {
            "sent": sent,
            "statuses": dict(self.statuses),
            "rate": round(sent / self.elapsed, 1) if self.elapsed else 0.0,
            "p50_ms": round(self.percentile(0.5) * 1000, 3),
            "p90_ms": round(self.percentile(0.9) * 1000, 3),
            "p99_ms": round(self.percentile(0.99) * 1000, 3),
            "max_ms": round(max(self.latencies, default=float("nan")) * 1000, 3),
        }


#: seconds a kept-alive connection may stay idle before it is dropped rather than reused, as
#: httpx's keepalive_expiry (5 s): well below a server's idle timeout (the router's 30 s), so a
#: request is never written to a connection the server is closing
KEEPALIVE_S = 5.0


class Target:
    """One URL, with a pool of kept-alive connections to its host, from `source` (a local
    address: another peer as the server sees it) if given."""

    def __init__(self, url: str, source: str | None = None) -> None:
        self.source = (source, 0) if source else None
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        path = parts.path or "/"
        self.request = (
            f"GET {path}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"
            f"Host: {self.host}:{self.port}\r\n\r\n"
        ).encode()
        #: kept-alive connections and when each went idle
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer, since = self._idle.pop()
            if time.perf_counter() - since < KEEPALIVE_S:
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port, local_addr=self.source)

    async def once(self, result: Result, began: float) -> None:
        """One request; its latency counted from `began` (its arrival)."""
        try:
            reader, writer = await self._connection()
            writer.write(self.request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1].decode()
            length, chunked, close = 0, False, False
            for line in head.split(b"\r\n")[1:]:
                key, _, value = line.partition(b":")
                key = key.strip().lower()
                if key == b"content-length":
                    length = int(value)
                elif key == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif key == b"connection" and b"close" in value.lower():
                    close = True
            if chunked:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            else:
                await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            result.statuses[type(err).__name__] += 1
            return
        result.statuses[status] += 1
        if status.startswith("2"):
            result.latencies.append(time.perf_counter() - began)
        if close:
            writer.close()
        else:
            self._idle.append((reader, writer, time.perf_counter()))


async def open_loop(targets: list[Target], rate: float, seconds: float, seed: int = 1) -> Result:
    """Poisson arrivals at `rate` per second over `targets` (in turn) for `seconds`."""
    result = Result()
    rng = random.Random(seed)
    tasks = set()
    start = time.perf_counter()
    at = start
    n = 0
    while at - start < seconds:
        at += rng.expovariate(rate)
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(targets[n % len(targets)].once(result, at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    if tasks:
        await asyncio.wait(tasks)
    result.elapsed = time.perf_counter() - start
    return result


async def closed_loop(target: Target, connections: int, seconds: float) -> Result:
    """`connections` clients, each sending its next request when its last one is answered."""
    result = Result()
    start = time.perf_counter()

    async def client() -> None:
        while time.perf_counter() - start < seconds:
            await target.once(result, time.perf_counter())

    await asyncio.gather(*(client() for _ in range(connections)))
    result.elapsed = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, default=100.0, help="Open loop: requests/s.")
    parser.add_argument("--closed", type=int, metavar="N", help="Closed loop: N connections.")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    target = Target(args.url)
    if args.closed:
        result = asyncio.run(closed_loop(target, args.closed, args.seconds))
    else:
        result = asyncio.run(open_loop([target], args.rate, args.seconds))
    print("RESULT " + json.dumps(result.summary()), flush=True)


if __name__ == "__main__":
    main()
