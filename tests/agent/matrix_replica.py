"""A replica on a server no one here wrote, as people run them: argv[1] names it (stdlib:
http.server's ThreadingHTTPServer speaking HTTP/1.0, a connection per request; stdlib-single:
its HTTPServer, one request at a time; uvicorn: an ASGI
app, HTTP/1.1 keep-alive; aiohttp: its web server, keep-alive; gunicorn: sync workers, which
close every connection). GET /health answers 200; GET /infer?delay=S answers, after S seconds,
`{"port", "pid"}`
(pid: the replica's main process); POST /echo answers the body it was sent."""

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PORT = int(os.environ["PORT"])
#: seconds a kept-alive connection may idle before the server closes it (argv[2]; uvicorn's
#: default is 5, aiohttp's 75)
KEEP_ALIVE = float(sys.argv[2]) if len(sys.argv) > 2 else None
#: the replica's own process (gunicorn's master: its workers are forked after this line)
MAIN_PID = os.getpid()


def answer(path: str, body: bytes) -> tuple[bytes, float]:
    """The body to answer with, and how long to wait first."""
    parts = urlsplit(path)
    if parts.path == "/echo":
        return body, 0.0
    delay = float(parse_qs(parts.query).get("delay", ["0"])[0])
    return json.dumps({"port": PORT, "pid": MAIN_PID}).encode(), delay


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data, delay = answer(self.path, body)
        time.sleep(delay)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _any


async def asgi(
    scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
    data, delay = answer(path, body)
    await asyncio.sleep(delay)
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def wsgi(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length)
    query = environ.get("QUERY_STRING", "")
    data, delay = answer(environ["PATH_INFO"] + ("?" + query if query else ""), body)
    time.sleep(delay)
    start("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def run_aiohttp() -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        data, delay = answer(str(request.rel_url), await request.read())
        await asyncio.sleep(delay)
        return web.Response(body=data, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    idle = {"keepalive_timeout": KEEP_ALIVE} if KEEP_ALIVE is not None else {}
    web.run_app(app, host="127.0.0.1", port=PORT, print=None, access_log=None, **idle)


def run_gunicorn() -> None:
    from gunicorn.app.base import BaseApplication

    class Application(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            self.cfg.set("bind", f"127.0.0.1:{PORT}")
            self.cfg.set("workers", 2)
            self.cfg.set("worker_class", "sync")
            self.cfg.set("loglevel", "warning")

        def load(self) -> Callable[..., Any]:
            return wsgi

    Application().run()


def main() -> None:
    kind = sys.argv[1]
    if kind == "stdlib":
        ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
    elif kind == "stdlib-single":  # one request at a time: the next wait in its listen queue
        HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
    elif kind == "uvicorn":
        import uvicorn

        idle = {"timeout_keep_alive": KEEP_ALIVE} if KEEP_ALIVE is not None else {}
        uvicorn.run(asgi, host="127.0.0.1", port=PORT, log_level="warning", **idle)  # type: ignore[arg-type]
    elif kind == "aiohttp":
        run_aiohttp()
    elif kind == "gunicorn":
        run_gunicorn()
    else:
        sys.exit(f"unknown server {kind!r}")


main()
