"""A small OpenAI-compatible server: the router's OpenAI API in the tests and its benchmark.

No model and no GPU: answers of a fixed text, made at once (stdlib only).

Serves HTTP/1.1 on $PORT, as vLLM and llama.cpp do, at the OpenAI paths:

    GET  /health                200
    POST /v1/chat/completions   a chat completion; `stream: true`: server-sent events, one chunk
                                per word of the answer, TOKEN_S apart, then `data: [DONE]`
    POST /v1/completions        a text completion
    POST /v1/embeddings         one 4-number embedding per input

Each answer names the model it was asked for and, in `system_fingerprint`, this replica's
name and port (the tests check where a request went). Usage: openai_server.py NAME [TOKEN_S]
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NAME = sys.argv[1]
TOKEN_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
WORDS = ["hello", "from", NAME]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # a head and a body written apart would wait out the client's delayed ACK (40 ms)
    disable_nagle_algorithm = True

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._json(200 if self.path == "/health" else 404, {"path": self.path})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        fingerprint = f"{NAME}:{os.environ['PORT']}"
        base = {"id": "x-1", "created": int(time.time()), "model": body["model"]}
        base["system_fingerprint"] = fingerprint
        if self.path == "/v1/chat/completions" and body.get("stream"):
            self._stream(base)
        elif self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": " ".join(WORDS)}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            self._json(200, {**base, "object": "chat.completion", "choices": [choice]})
        elif self.path == "/v1/completions":
            choice = {"index": 0, "text": " ".join(WORDS), "finish_reason": "stop"}
            self._json(200, {**base, "object": "text_completion", "choices": [choice]})
        elif self.path == "/v1/embeddings":
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [
                {"object": "embedding", "index": i, "embedding": [float(i), 0.5, 0.25, 0.125]}
                for i in range(len(inputs))
            ]
            usage = {"prompt_tokens": 1, "total_tokens": 1}
            self._json(
                200, {"object": "list", "data": data, "model": body["model"], "usage": usage}
            )
        else:
            self._json(404, {"path": self.path, "fingerprint": fingerprint})

    def _stream(self, base: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, word in enumerate(WORDS):
            if i:
                time.sleep(TOKEN_S)
            delta = {"content": word}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            chunk = {**base, "object": "chat.completion.chunk", "choices": [choice]}
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
