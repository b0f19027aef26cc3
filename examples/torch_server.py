"""A model server for a real GPU: a transformers model built from its config with random weights
(nothing is downloaded), served on $PORT for a gpupool service.

    torch_server.py --model bert     BERT-base: POST|GET /infer?tokens=N, one forward pass of a
                                     batch of one sequence of N tokens; {"ms", "norm"}
    torch_server.py --model gpt2     GPT-2 small: GET /generate?tokens=N, greedy decoding of N
                                     tokens as server-sent events, each token sent (its own
                                     chunk) the moment it is decoded; /infer: one forward pass
    GET /health                      200 once the model is on the GPU

It needs PyTorch and transformers (`pip install torch transformers`) and a CUDA GPU; under
gpupool the GPU is the replica's share (`gpupool service create NAME --memory 4Gi --compute 25
-- python examples/torch_server.py --model gpt2`). One request runs on the GPU at a time per
replica: concurrency comes from replicas, which the autoscaler adds.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

MAX_TOKENS = 1024


class Model:
    """The model on the GPU, in half precision, one request at a time."""

    def __init__(self, kind: str) -> None:
        torch.manual_seed(0)
        self.kind = kind
        if kind == "bert":
            self.config: Any = BertConfig()
            self.net: Any = BertModel(self.config)
        else:
            self.config = GPT2Config()
            self.net = GPT2LMHeadModel(self.config)
        self.net = self.net.to("cuda", dtype=torch.float16).eval()
        self.lock = threading.Lock()
        self.infer(16)  # the first pass loads the kernels: not a user's request

    @torch.inference_mode()
    def infer(self, tokens: int) -> float:
        ids = torch.randint(0, self.config.vocab_size, (1, tokens), device="cuda")
        with self.lock:
            out = self.net(input_ids=ids)
            first = out.last_hidden_state if self.kind == "bert" else out.logits
            norm = float(first.float().norm())
            torch.cuda.synchronize()
        return norm

    @torch.inference_mode()
    def generate(self, tokens: int) -> Any:
        """Yield one decoded token id at a time (greedy), with the KV cache."""
        ids = torch.randint(0, self.config.vocab_size, (1, 8), device="cuda")
        past = None
        with self.lock:
            for _ in range(tokens):
                out = self.net(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                ids = out.logits[:, -1:].argmax(dim=-1)
                yield int(ids.item())  # .item() waits for the GPU: the token exists


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _tokens(self, query: dict[str, str]) -> int:
        return max(1, min(MAX_TOKENS, int(query.get("tokens", "128"))))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        model = self.server.model
        if url.path == "/health":
            self._json(200 if model is not None else 503, {"ready": model is not None})
        elif model is None:
            self._json(503, {"error": "Loading", "message": "the model is loading"})
        elif url.path == "/infer":
            began = time.perf_counter()
            norm = model.infer(self._tokens(query))
            self._json(200, {"ms": (time.perf_counter() - began) * 1000, "norm": norm})
        elif url.path == "/generate" and model.kind == "gpt2":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for token in model.generate(self._tokens(query)):
                event = f"data: {token}\n\n".encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._json(404, {"error": "NotFound", "message": f"no route {url.path}"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    model: Model | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--model", choices=("bert", "gpt2"), default="gpt2")
    args = parser.parse_args()
    server = Server(("127.0.0.1", int(os.environ["PORT"])), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.model = Model(args.model)  # /health answers 503 until here
    threading.Event().wait()


if __name__ == "__main__":
    main()
