"""A replica on Python's http.server, as simple services are written: GET answers its path and
pid (GET /big: 256 MiB), POST reads its Content-Length body (and ignores Transfer-Encoding, as
http.server does). argv: the protocol version it speaks, HTTP/1.0 (a connection per request)
or HTTP/1.1."""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = sys.argv[1]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, body: bytes = b"") -> None:
        data = json.dumps({"path": self.path, "pid": os.getpid(), "body": body.decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/big":
            self._answer()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(256 << 20))
        self.end_headers()
        for _ in range(256):
            self.wfile.write(bytes(1 << 20))

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)))


ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
