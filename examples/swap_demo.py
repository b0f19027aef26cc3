"""More models than fit on a GPU, as a user sees it (`make demo`, about 15 s): two chat models of
24 GiB each on one simulated A100-40GB, which holds one at a time, behind the router's OpenAI API.

The second model's start swaps the first (idle) out to host memory; a chat request through the
official `openai` client to the parked one swaps it back in while the router holds the request,
its tokens streamed as they are made; then what that swap cost against the model's cold start.
Usage: examples/swap_demo.py [BIN_DIR]   (BIN_DIR holds gpupool and python; default .venv/bin)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from demo_support import bold, cli, free_port, simulated_daemon, until  # noqa: E402


def main() -> None:
    bin_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin").resolve()
    gpupool, python = str(bin_dir / "gpupool"), str(bin_dir / "python")
    work = Path(tempfile.mkdtemp(prefix="gpupool-swap-"))
    port = free_port()
    env = dict(os.environ, GPUPOOL_URL=f"unix://{work / 'state' / 'gpupool.sock'}")

    run = cli(gpupool, env)

    def service(name: str) -> dict[str, Any]:
        return dict(json.loads(run("service", "describe", name, "--json", show=False)))

    bold("== More models than fit: two chat models of 24 GiB on one simulated A100-40GB ==")
    with simulated_daemon(gpupool, "1xA100-40GB", work, port, env):
        cold = {}
        for name in ("chat-a", "chat-b"):
            began = time.monotonic()
            run(
                "service", "create", name, "--replicas", "0..1", "--memory", "24Gi",
                "--compute", "50", "--keep-alive", "10m", "--workdir", "/tmp", "--",
                python, str(HERE / "openai_server.py"), name, "0.02", "--memory-mib", "4096",
            )  # fmt: skip
            _until(lambda n=name: service(n)["replicas"]["ready"] == 1)  # type: ignore[misc]
            cold[name] = time.monotonic() - began
        _until(lambda: not service("chat-a")["resident"])
        bold("chat-b's start swapped chat-a (idle) out to host memory")
        run("service", "ls")
        bold("A chat request to chat-a through the openai client: swapped back in, streamed")
        _chat(f"http://127.0.0.1:{port}/v1")
        _until(lambda: not service("chat-b")["resident"])
        run("service", "ls")
        swapped = service("chat-a")["swaps"]["last_in_s"]
        print(
            f"  chat-a's swap in took {swapped:.2f} s (its 4 GiB back over the host link, "
            f"checked healthy), against {cold['chat-a']:.2f} s for its cold start here: a "
            "simulated model loads at once; a real LLM's cold start is its load from disk, "
            "tens of seconds to minutes"
        )


def _chat(base_url: str) -> None:
    api = openai.OpenAI(base_url=base_url, api_key="none")
    print('  >>> api.chat.completions.create(model="chat-a", messages=[...], stream=True)')
    began = time.monotonic()
    first = None
    print("  ", end="", flush=True)
    for chunk in api.chat.completions.create(
        model="chat-a", messages=[{"role": "user", "content": "hello?"}], stream=True
    ):
        first = first if first is not None else time.monotonic() - began
        print(chunk.choices[0].delta.content or "", end=" ", flush=True)
    took = time.monotonic() - began
    print(f"\n  first token after {first or 0:.2f} s, the whole answer after {took:.2f} s")


def _until(check: Callable[[], bool], timeout: float = 60) -> None:
    if not until(check, timeout):
        raise SystemExit("the demo's daemon did not get there in time")


if __name__ == "__main__":
    main()
