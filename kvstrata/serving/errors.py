"""OpenAI-style error bodies and the exception handlers that produce them.

Every error the HTTP layer returns has the shape OpenAI clients parse:
`{"error": {"message": str, "type": str, "param": str | None, "code": str | int | None}}`.

| raised                               | status | type                   |
|--------------------------------------|--------|------------------------|
| invalid JSON, wrong types (pydantic) | 400    | invalid_request_error  |
| `InvalidRequestError` (engine/proto) | 400    | invalid_request_error  |
| `APIError` (anything the layer says) | its own| its own                |
| unknown route / wrong method         | 404/405| invalid_request_error  |
| `EngineOverloadedError`              | 429    | rate_limit_error (+ Retry-After) |
| `EngineDeadError`                    | 503    | server_error           |
| any other exception                  | 500    | server_error           |

`install_error_handlers` wires these into an app; unexpected exceptions go through
`CatchAllMiddleware` rather than an `Exception` handler (see its docstring).

A message quotes client input through `quote` (at most `QUOTE_CHARS` of it), and `error_body`
cuts any message and param to `MAX_MESSAGE_CHARS` / `MAX_PARAM_CHARS` as a backstop, so an error
never echoes a megabyte the client sent.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvstrata.engine.outputs import EngineDeadError, EngineOverloadedError
from kvstrata.engine.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 1  # what a 429 asks the client to wait, in seconds
QUOTE_CHARS = 64  # of a client's value quoted in a message
MAX_MESSAGE_CHARS = 1024
MAX_PARAM_CHARS = 256


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)`, or its first `limit` characters and how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as written"
    return f"{text[:limit]}... ({size})"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class APIError(Exception):
    """An error with an HTTP status that the server reports as an OpenAI-style body."""

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


def error_body(
    message: str, type: str, param: str | None = None, code: str | int | None = None  # noqa: A002
) -> dict[str, Any]:
    param = _cut(param, MAX_PARAM_CHARS) if param is not None else None
    return {"error": {"message": _cut(message, MAX_MESSAGE_CHARS), "type": type, "param": param, "code": code}}


def error_response(
    status_code: int,
    message: str,
    type: str = "invalid_request_error",  # noqa: A002
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status_code, headers=headers)


def api_error_from(exc: BaseException) -> APIError:
    """Map any exception a request can hit to the APIError the client sees."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(400, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, EngineOverloadedError):
        return APIError(
            429, f"the server is overloaded: {exc}; retry later", "rate_limit_error", code="overloaded",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if isinstance(exc, EngineDeadError):
        return APIError(
            503, f"the engine is not running ({exc}); check the server log and restart it",
            "server_error", code="engine_dead",
        )
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", code="internal_error")


def loc_to_param(loc: Sequence[str | int]) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'; the body itself -> None."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _common_prefix(locs: list[tuple[str | int, ...]]) -> tuple[str | int, ...]:
    prefix = locs[0]
    for loc in locs[1:]:
        n = 0
        while n < min(len(prefix), len(loc)) and prefix[n] == loc[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def validation_error_to_api_error(errors: Sequence[dict[str, Any]]) -> APIError:
    """Turn pydantic/FastAPI validation errors into one 400 naming the first bad field.

    A union field (for example `stop: str | list[str]`) reports one error per member with the
    member's name appended to the location; the common prefix of the first field's errors is
    the real field path.
    """
    if not errors:
        return APIError(400, "the request body is invalid")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON ({detail}); send a JSON object", code="invalid_json")
    loc = tuple(first.get("loc", ()))
    top = loc[:2]
    same_field = [tuple(e.get("loc", ())) for e in errors if tuple(e.get("loc", ()))[:2] == top]
    param = loc_to_param(_common_prefix(same_field))
    if first.get("type") == "value_error" and "error" in (first.get("ctx") or {}):
        msg = str(first["ctx"]["error"])
    elif first.get("type") == "missing" and param is None:
        msg = "the request body is missing; send a JSON object"
    elif first.get("type") == "model_attributes_type" and param is None:
        msg = "the request body must be a JSON object, sent with Content-Type: application/json"
    else:
        msg = str(first.get("msg", "invalid value"))
    if param is not None and not msg.startswith(param.split(".")[0].split("[")[0]):
        msg = f"{param}: {msg}"
    return APIError(400, msg, param=param, code="invalid_value")


def _to_response(err: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return error_response(err.status_code, err.message, err.type, err.param, err.code, headers or err.headers)


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    err = api_error_from(exc)
    if err.status_code >= 500:
        logger.warning("request_failed path=%s status=%d error=%s", request.url.path, err.status_code, err.message)
    return _to_response(err)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _to_response(validation_error_to_api_error(exc.errors()))


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    path = request.url.path
    where = f"{request.method} {path if len(path) <= 200 else path[:200] + '...'}"  # no 100 KB echo
    if exc.status_code == 404:
        msg = f"Invalid URL ({where}); see GET /v1/models and POST /v1/chat/completions"
        err = APIError(404, msg, code="not_found")
    elif exc.status_code == 405:
        allowed = (headers or {}).get("allow", (headers or {}).get("Allow", ""))
        msg = f"Method not allowed ({where}); use {allowed or 'another method'}"
        err = APIError(405, msg, code="method_not_allowed")
    else:
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        err = APIError(exc.status_code, str(exc.detail), kind)
    return _to_response(err, headers)


class CatchAllMiddleware:
    """Answer an unexpected exception with a 500 body and keep the connection usable.

    Starlette's own `Exception` handler re-raises after responding, and uvicorn then drops the
    keep-alive connection, so a client's next request on it can fail; this one does not re-raise.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception as exc:
            logger.exception("unhandled_error path=%s error=%r", scope.get("path"), exc)
            if started:  # too late for a status; the server closes the connection
                raise
            await _to_response(api_error_from(exc))(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    for exc_type in (APIError, InvalidRequestError, EngineDeadError, EngineOverloadedError):
        app.add_exception_handler(exc_type, _on_api_error)
    app.add_middleware(CatchAllMiddleware)
