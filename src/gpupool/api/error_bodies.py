"""Every error the API answers has one shape, `{"error": CLASS, "message": ONE LINE}`, with CLASS
a name of the error tree (core/errors.py), so the client turns any of them back into that class:
the tree's own errors, a body or parameter that does not validate, and what FastAPI and Starlette
answer themselves with `{"detail": ...}` (an unknown path 404, a method a path does not take
405, a body that is not UTF-8 or nests too deep to parse 400)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gpupool.core.errors import (
    DaemonError,
    GpupoolError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    StoreBusy,
    Unauthorized,
)

#: the tree's class for a status FastAPI or Starlette answers on their own
_CLASS_OF_STATUS: dict[int, type[GpupoolError]] = {
    401: Unauthorized,
    403: PermissionDenied,
    404: NotFound,
}


def install(app: FastAPI) -> None:
    """Answer every error of `app` in the documented shape."""
    app.add_exception_handler(GpupoolError, _tree_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _framework_error)


def error_body(kind: type[GpupoolError], message: str, status: int, **headers: str) -> JSONResponse:
    return JSONResponse(
        {"error": kind.__name__, "message": message}, status_code=status, headers=headers or None
    )


async def _tree_error(_: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, GpupoolError)
    headers = {}
    if isinstance(err, StoreBusy):
        # a locked store is let go within a second or so: say when to come back
        headers["Retry-After"] = "1"
    elif isinstance(err, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return error_body(type(err), str(err), err.http_status, **headers)


async def _invalid(_: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestValidationError)
    first = err.errors()[0] if err.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = f"invalid request: {where}: {first.get('msg', 'malformed')}"
    return error_body(InvalidRequest, message, 400)


async def _framework_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, HTTPException)
    status = err.status_code
    headers = dict(err.headers or {})
    if status == 404:
        message = f"no such path {request.url.path} (the API's routes are at /docs)"
    elif status == 405:
        allowed = headers.get("allow", headers.get("Allow", ""))
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    elif status == 400:
        message = f"the request body is not JSON this daemon can read: {_why(err)}"
    else:
        message = str(err.detail).replace("\n", " ")
    kind = _CLASS_OF_STATUS.get(status, InvalidRequest if status < 500 else DaemonError)
    return error_body(kind, message, status, **headers)


def _why(err: HTTPException) -> str:
    """What made a body unreadable, from the parse error FastAPI chained."""
    cause = err.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 text (byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "it nests too deep"
    return str(err.detail)
