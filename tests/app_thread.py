"""The daemon's real app served by uvicorn in a thread, on a Unix socket, for client tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn


@contextmanager
def serving(app: Any, path: Path) -> Iterator[str]:
    """`app` answering at `path` until the block ends; its URL."""
    server = uvicorn.Server(uvicorn.Config(app, uds=str(path), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not start"
        time.sleep(0.01)
    try:
        yield f"unix://{path}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
