"""The daemon's client: finds the daemon, sends requests, maps answers back onto the error tree.

Where: `--url`, else $GPUPOOL_URL (`unix:///path/to.sock`, `http://host:port` or
`https://host:port`, token from $GPUPOOL_TOKEN), else the default state dir's socket. It uses the
standard library's http.client only, and imports neither FastAPI nor httpx nor the agent's
machinery: every client command pays for its imports at each start. HTTPS checks the server's
certificate against the system's CAs (or $SSL_CERT_FILE).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpupool.core import settings
from gpupool.core.errors import DaemonError, InvalidRequest, PermissionDenied
from gpupool.core.errors import from_answer as error_from_answer
from gpupool.isolation.daemon_paths import default_socket

TIMEOUT_S = 30.0
#: what a server's dropped keep-alive connection looks like at the next request
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def resolve_url(url: str | None) -> str:
    chosen = url or settings.URL.read(os.environ)
    if chosen:
        return chosen
    return f"unix://{default_socket()}"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (the Host header is a placeholder)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("gpupool", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection for `url` and the path prefix its requests go under."""
    if url.startswith("unix://"):
        return _UnixConnection(url.removeprefix("unix://"), timeout), ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(
            f"invalid daemon URL {url!r}: use unix:///path/to.sock, http://host:port or "
            "https://host:port"
        )
    prefix = parts.path.rstrip("/")
    if parts.scheme == "http":
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), prefix
    import ssl  # only HTTPS pays for it (about a third of http.client's import time again)

    context = ssl.create_default_context()
    return (
        http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=context),
        prefix,
    )


def _query(params: dict[str, Any] | None) -> str:
    """`?all=true&limit=5`: booleans as the API reads them, None left out."""
    if not params:
        return ""
    pairs = {
        key: (str(value).lower() if isinstance(value, bool) else value)
        for key, value in params.items()
        if value is not None
    }
    return "?" + urlencode(pairs)


class Client:
    """One keep-alive connection to one daemon."""

    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = TIMEOUT_S
    ) -> None:
        self.url = resolve_url(url)
        self.timeout = timeout
        self._http, self._prefix = _connection(self.url, timeout)
        self._headers = {"Accept": "application/json"}
        if not self.url.startswith("unix://"):  # the socket's peer uid stands for a token
            secret = token if token is not None else settings.TOKEN.read(os.environ)
            if secret:
                self._headers["Authorization"] = f"Bearer {secret}"
        self._used = False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """The JSON answer, or the error it stands for as one of gpupool's errors."""
        target = self._prefix + path + _query(params)
        body = None if json is None else _dumps(json)
        try:
            status, data = self._exchange(method, target, body, timeout or self.timeout)
        except (FileNotFoundError, ConnectionRefusedError) as err:
            raise DaemonError(
                f"no gpupool daemon at {self.url}: start one with `gpupool serve` "
                "(or point --url / GPUPOOL_URL at a running one)"
            ) from err
        except PermissionError as err:
            # the caller cannot see which group the socket is for (its directory is closed to
            # them too), so the line names the rule and the default, not a group it cannot know
            raise PermissionDenied(
                f"cannot connect to the daemon at {self.url}: permission denied (only the "
                "daemon's user and its socket group, gpupool unless --socket-group says "
                "otherwise, may connect: ask an admin to add you)"
            ) from err
        except TimeoutError as err:
            raise DaemonError(
                f"the daemon at {self.url} did not answer within {timeout or self.timeout:g} s"
            ) from err
        except (OSError, http.client.HTTPException) as err:
            raise DaemonError(f"the daemon at {self.url} did not answer: {err}") from err
        return _answer(self.url, status, data)

    def _exchange(
        self, method: str, target: str, body: bytes | None, timeout: float
    ) -> tuple[int, bytes]:
        """One request and its whole answer. A keep-alive connection the daemon has dropped since
        the last request is opened again, once, for a request that changes nothing."""
        try:
            return self._once(method, target, body, timeout)
        except _STALE:
            if not self._used or method != "GET":
                raise
        return self._once(method, target, body, timeout)

    def _once(
        self, method: str, target: str, body: bytes | None, timeout: float
    ) -> tuple[int, bytes]:
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        self._http.timeout = timeout
        if self._http.sock is not None:
            self._http.sock.settimeout(timeout)
        try:
            self._http.request(method, target, body=body, headers=headers)
            response = self._http.getresponse()
            data = response.read()
        except BaseException:
            # http.client refuses the next request on a connection that failed mid-request:
            # closed, it connects again (a restarted daemon answers the next call)
            self._http.close()
            raise
        self._used = True
        if response.will_close:
            self._http.close()
        return response.status, data


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def _answer(url: str, status: int, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        body = {}
    if status >= 400:
        if not isinstance(body, dict):
            body = {}
        message = str(body.get("message") or f"the daemon answered {status}")
        raise error_from_answer(str(body.get("error", "")), status, message)
    if not isinstance(body, dict):
        raise DaemonError(f"the daemon at {url} sent something that is not a JSON object")
    return body
