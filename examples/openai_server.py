"""A small OpenAI-compatible server: the router's OpenAI API in the tests, its benchmark and
`make demo`.

Serves HTTP/1.1 on $PORT, as vLLM and llama.cpp do, at the OpenAI paths:

    GET  /health                200
    POST /v1/chat/completions   a chat completion; `stream: true`: server-sent events, one chunk
                                per token of the answer, each sent the moment it is made, then
                                `data: [DONE]`
    POST /v1/completions        a text completion
    POST /v1/embeddings         one 4-number embedding per input

Each answer names the model it was asked for and, in `system_fingerprint`, this replica's
name and port (the tests check where a request went). Its tokens come from one of:

    (default)        a fixed text, TOKEN_S apart: no GPU (stdlib only)
    --memory-mib N   a model's weights held on the GPU (N MiB) and one kernel per token, through
                     the CUDA driver API: the simulated driver on a simulated node, so it is a
                     real share, parked and swapped like a model (examples/model_server.py's Gpu)
    --gpt2           a real GPU: GPT-2 small built from its transformers config with random
                     weights (nothing downloaded), greedy decoding with its KV cache, each token
                     id sent as it is decoded; needs torch and transformers

Usage: openai_server.py NAME [TOKEN_S] [--memory-mib N | --gpt2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: how many tokens an answer has (the default's: its fixed words)
ANSWER_TOKENS = 8


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("name")
    parser.add_argument("token_s", type=float, nargs="?", default=0.0)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--memory-mib", type=int, help="Weights held on the GPU, in MiB.")
    source.add_argument("--gpt2", action="store_true", help="GPT-2 small on a real GPU.")
    return parser.parse_args()


ARGS = _args()
NAME = ARGS.name
TOKEN_S = ARGS.token_s
WORDS = ["hello", "from", NAME]


def _words() -> Iterator[str]:
    for i, word in enumerate(WORDS):
        if i:
            time.sleep(TOKEN_S)
        yield word


def _source() -> Callable[[], Iterator[str]]:
    """What makes an answer's tokens, one at a time."""
    if ARGS.memory_mib is not None:
        from model_server import Gpu

        gpu = Gpu(ARGS.memory_mib)

        def kernels() -> Iterator[str]:
            for n in range(ANSWER_TOKENS):
                gpu.run(1, 16, 1024)  # a batch-1 decode step: 0.5 ms on 16 SMs
                yield WORDS[n % len(WORDS)]
                time.sleep(TOKEN_S)

        return kernels
    if ARGS.gpt2:
        try:
            from torch_server import Model
        except ImportError as err:
            missing = f"--gpt2 needs torch and transformers ({err.name} is missing)"
            raise SystemExit(missing) from None
        model = Model("gpt2")
        return lambda: (str(token) for token in model.generate(ANSWER_TOKENS))
    return _words


TOKENS = _source()


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
            message = {"role": "assistant", "content": " ".join(TOKENS())}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            self._json(200, {**base, "object": "chat.completion", "choices": [choice]})
        elif self.path == "/v1/completions":
            choice = {"index": 0, "text": " ".join(TOKENS()), "finish_reason": "stop"}
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
        for word in TOKENS():
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
