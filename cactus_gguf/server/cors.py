"""What the HTTP layer sends as llama-server sends it: its CORS policy (once ``--cors-origin``
turns CORS on) and its header-name spelling.

CORS: ``--cors-origin`` names the origins whose pages may call the server (``*``: any). As
llama-server's (its ``--cors-origins``, credentials on by default), credentials are allowed, so
a page's origin is echoed back in ``Access-Control-Allow-Origin`` (a credentialed answer may not
say ``*``) with ``Access-Control-Allow-Credentials: true``, and a preflight is answered with
llama-server's method list and ``Access-Control-Allow-Headers: *``. Starlette's CORSMiddleware
does the work; only the preflight's allowed headers differ (Starlette echoes the requested ones).
Without ``--cors-origin`` no CORS header is sent (this server's safer default: docs/server.md).

Header names: Starlette writes them in lower case (HTTP/1.1 names are case-insensitive), where
llama-server (cpp-httplib) writes ``Content-Type``, ``Access-Control-Allow-Origin``, ...; clients
that read a response's headers as a plain dict (llama.cpp's own server tests do) look them up by
that spelling, so :class:`CanonicalHeaders` writes every all-lower-case name with each word
capitalised. The HTTP server must keep the spelling: uvicorn's h11 protocol does (its httptools
protocol lower-cases names again), so ``serve`` runs uvicorn with ``http="h11"``.
"""
from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

__all__ = ["LLAMA_CORS_METHODS", "LlamaCors", "CanonicalHeaders", "canonical"]

LLAMA_CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")  # llama-server's --cors-methods default


class LlamaCors(CORSMiddleware):
    """Starlette's CORS middleware with llama-server's settings for ``origins``: credentials
    allowed (a page's origin echoed, never ``*``), its methods, and a preflight that allows any
    header by answering ``Access-Control-Allow-Headers: *``, as llama-server's."""

    def __init__(self, app, origins: tuple[str, ...]) -> None:
        super().__init__(app, allow_origins=list(origins), allow_credentials=True,
                         allow_methods=list(LLAMA_CORS_METHODS), allow_headers=["*"])

    def preflight_response(self, request_headers) -> Response:
        response = super().preflight_response(request_headers)
        response.headers["Access-Control-Allow-Headers"] = "*"
        return response


def canonical(name: bytes) -> bytes:
    """A header name in the usual spelling (``access-control-allow-origin`` ->
    ``Access-Control-Allow-Origin``); a name already holding a capital is left as it is."""
    if name != name.lower():
        return name
    return b"-".join(word[:1].upper() + word[1:] for word in name.split(b"-"))


class CanonicalHeaders:
    """An ASGI wrapper that writes the response's header names as :func:`canonical` spells
    them (the module docstring says why); the body passes untouched."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def spelt(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(canonical(bytes(k)), v)
                                                  for k, v in message.get("headers", [])]}
            await send(message)

        await self.app(scope, receive, spelt)
