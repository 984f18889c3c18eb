"""The two error shapes the server answers in, and the reading of an invalid body.

OpenAI's (``/v1/*``, the Responses API): ``{"error": {"message", "type", "param", "code"}}``.
llama-server's (its native routes): ``{"error": {"code": status, "message", "type"}}`` plus the
field at fault as ``param`` (server-common.cpp's format_error_response in the vendored llama.cpp).
A prompt longer than the context is llama-server's ``exceed_context_size_error`` on both, with
``n_prompt_tokens`` and ``n_ctx`` (OpenAI's ``code`` ``context_length_exceeded`` kept on the
OpenAI shape, which OpenAI's clients read).
"""
from __future__ import annotations

import json
from typing import Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from ..errors import CactusError, ContextLengthError
from .schemas import openai_param

__all__ = ["error", "error_of", "llama_error", "llama_error_of", "field_name", "invalid_body",
           "answering_route", "Refused"]


def _same(text: str) -> str:
    return text


def _context_fields(e: BaseException) -> dict:
    """llama-server's extra fields of a prompt over the context."""
    if isinstance(e, ContextLengthError) and e.n_prompt_tokens is not None:
        return {"n_prompt_tokens": e.n_prompt_tokens, "n_ctx": e.n_ctx}
    return {}


def error(status: int, message: str, *, type_: str = "invalid_request_error",
          param: str | None = None, code: str | None = None, headers=None,
          extra: dict | None = None) -> JSONResponse:
    """OpenAI's error answer."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code, **(extra or {})}},
                        status_code=status, headers=headers)


def _namer(body) -> Callable[[str], str]:
    return (lambda n: openai_param(n, body)) if body is not None else (lambda n: n)


def error_of(e: BaseException, redact=_same, body=None) -> JSONResponse:
    """An engine or input error as OpenAI's answer (errors.py gives status and type); ``redact``
    takes this machine's paths out of the message (app.Redactor); with the request's ``body``,
    options are named as its client wrote them (``speculative.draft_vocab``). Anything that is
    not a CactusError is a 500 with its one-line reason."""
    if not isinstance(e, CactusError):
        return error(500, redact(str(e)), type_="server_error")
    headers = {"Retry-After": "1"} if e.http_status == 503 else None
    name = _namer(body)
    context = _context_fields(e)
    return error(e.http_status, redact(e.render(name)),
                 type_="exceed_context_size_error" if context else e.error_type,
                 param=name(e.param) if e.param else None, code=e.code, headers=headers,
                 extra=context)


# llama-server's error types by status (server-common.cpp: format_error_response)
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "invalid_request_error", 500: "server_error",
          501: "not_supported_error", 503: "unavailable_error"}


def llama_error(status: int, message: str, *, param: str | None = None, type_: str | None = None,
                code: str | None = None, headers=None, extra: dict | None = None) -> JSONResponse:
    """llama-server's error answer: ``{"error": {"code": status, "message", "type"}}`` (plus the
    field at fault as ``param``). ``code``: the OpenAI answer's code, unused (llama-server's code
    is the status); taken so that either answer can be made with the same call."""
    return JSONResponse({"error": {"code": status, "message": message,
                                   "type": type_ or _TYPES.get(status, "server_error"),
                                   "param": param, **(extra or {})}},
                        status_code=status, headers=headers)


def llama_error_of(e: BaseException, redact: Callable[[str], str] = _same,
                   body=None) -> JSONResponse:
    """An engine or input error as llama-server answers it (a prompt over the context: its
    ``exceed_context_size_error``); options named as the client wrote them."""
    if not isinstance(e, CactusError):
        return llama_error(500, redact(f"{type(e).__name__}: {e}"))
    name = _namer(body)
    context = _context_fields(e)
    return llama_error(e.http_status, redact(e.render(name)), param=name(e.param) if e.param
                       else None, type_="exceed_context_size_error" if context else None,
                       headers={"Retry-After": "1"} if e.http_status == 503 else None,
                       extra=context)


_TYPE_TAGS = {"str", "bool", "int", "float", "none", "dict"}


def field_name(loc) -> str:
    """A pydantic error location as the client's field name: ``speculative.k``, ``messages.0``
    (without "body" and the tags pydantic adds for the members of a union, e.g. "Speculative")."""
    parts = [str(p) for p in loc if p != "body" and not (
        isinstance(p, str) and (p[:1].isupper() or "[" in p or p in _TYPE_TAGS))]
    return ".".join(parts) if parts else "body"


def invalid_body(exc: RequestValidationError) -> tuple[str, str | None]:
    """The one-line message of an invalid body, and the field at fault (None: not JSON)."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('msg')}", None
    name = field_name(first.get("loc", ()))
    message = f"{name}: {first.get('msg')}"
    if str(first.get("type", "")).endswith("_type") and "input" in first:  # strict types
        message += f", got {json.dumps(first['input'], default=str)[:60]}"
    return message, name


class Refused(Exception):
    """A route cannot serve its request (the engine is not ready): ``response`` is the answer
    saying why, which an :func:`answering_route` sends as it is."""

    def __init__(self, response: Response) -> None:
        super().__init__("the request is refused")
        self.response = response


def answering_route(invalid: Callable[[str, str | None], Response],
                    failed: Callable[[BaseException, Callable[[str], str]], Response]) -> type:
    """An APIRoute class whose routes answer every failure in one API's error shape:
    ``invalid(message, field)`` for a body that does not validate, ``failed(e, redact)`` for an
    input or engine error or anything unexpected (one line, never a traceback); a Refused's own
    answer."""

    class Route(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except RequestValidationError as exc:
                    return invalid(*invalid_body(exc))
                except Refused as e:
                    return e.response
                except Exception as e:  # noqa: BLE001 - every failure answers in the API's shape
                    return failed(e, request.app.state.redact)

            return route

    return Route

