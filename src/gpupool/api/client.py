"""The daemon's client (httpx): finds the daemon, sends requests, maps answers to the error tree.

Where: `--url`, else $GPUPOOL_URL (`unix:///path/to.sock` or `http://host:port`, token from
$GPUPOOL_TOKEN), else the default state dir's socket. It imports neither FastAPI nor the agent's
machinery, so a client command starts fast.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from gpupool.agent.statedir import SOCKET_NAME, default_state_dir
from gpupool.core import errors, settings
from gpupool.core.errors import DaemonError, GpupoolError, InvalidRequest

_ERRORS: dict[str, type[GpupoolError]] = {
    "InvalidRequest": InvalidRequest,
    "NotFound": errors.NotFound,
    "PermissionDenied": errors.PermissionDenied,
    "Unschedulable": errors.Unschedulable,
    "ConfigError": errors.ConfigError,
    "DeviceError": errors.DeviceError,
    "DaemonError": DaemonError,
    "Unauthorized": errors.PermissionDenied,
}
TIMEOUT_S = 30.0


def resolve_url(url: str | None) -> str:
    chosen = url or settings.URL.read(os.environ)
    if chosen:
        return chosen
    return f"unix://{default_state_dir() / SOCKET_NAME}"


class Client:
    """One connection to one daemon."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = TIMEOUT_S
    ) -> None:
        self.url = resolve_url(url)
        if self.url.startswith("unix://"):
            self._where = self.url.removeprefix("unix://")
            transport = httpx.HTTPTransport(uds=self._where)
            self._http = httpx.Client(
                transport=transport, base_url="http://gpupool", timeout=timeout
            )
        elif self.url.startswith(("http://", "https://")):
            self._where = self.url
            secret = token if token is not None else settings.TOKEN.read(os.environ)
            headers = {"Authorization": f"Bearer {secret}"} if secret else {}
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        else:
            raise InvalidRequest(
                f"invalid daemon URL {self.url!r}: use unix:///path/to.sock or http://host:port"
            )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The JSON answer, or the error it stands for as one of gpupool's errors."""
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as err:
            raise DaemonError(
                f"no gpupool daemon at {self.url}: start one with `gpupool serve` "
                "(or point --url / GPUPOOL_URL at a running one)"
            ) from err
        except httpx.HTTPError as err:
            raise DaemonError(f"the daemon at {self.url} did not answer: {err}") from err
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code >= 400:
            message = body.get("message") if isinstance(body, dict) else None
            kind = _ERRORS.get(
                str(body.get("error")) if isinstance(body, dict) else "", DaemonError
            )
            raise kind(message or f"the daemon answered {response.status_code}")
        if not isinstance(body, dict):
            raise DaemonError(f"the daemon at {self.url} sent something that is not JSON")
        return body
