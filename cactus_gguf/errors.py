"""One exception hierarchy for the whole package.

    CactusError
    ├── InputError        the caller asked for something invalid: a bad option value, a missing or
    │                     unloadable model file, an incompatible pair, an empty prompt.
    │                     CLI exit code 1, HTTP 400 (invalid_request_error).
    ├── CapacityError     valid, but does not fit: a prompt longer than the context (HTTP 400,
    │                     context_length_exceeded), a KV cache larger than memory (exit 2), the
    │                     engine busy with another caller (HTTP 503).
    └── EngineError       llama.cpp or the native helper failed underneath (a failed decode, NaN
                          logits, a download that broke). CLI exit code 3, HTTP 500.

Messages are one line. A message names options by their API names written as ``{name}``
placeholders (listed in ``options``): ``str(e)`` fills them with the API names, a front end fills
them with its own spelling (the CLI with flags: ``e.render(lambda n: "-c/--ctx-size")``), so library
messages never name CLI flags. ``param`` is the one option at fault, when there is one.
"""
from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["CactusError", "InputError", "CapacityError", "ContextLengthError", "EngineBusyError",
           "EngineError"]


class CactusError(Exception):
    """Base of every error cactus-gguf raises on purpose.

    Args:
        message: one line; ``{name}`` for each option it names (see ``options``).
        param: the option at fault (its API name), or None.
        options: option names used as placeholders in ``message`` (``param`` is always one).
    """

    exit_code = 1
    http_status = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None,
                 options: Iterable[str] = ()) -> None:
        self.message = message
        self.param = param
        self.options = tuple(dict.fromkeys(([param] if param else []) + list(options)))
        super().__init__(message)

    def render(self, name: Callable[[str], str] = lambda n: n) -> str:
        """The message with each ``{option}`` placeholder replaced by ``name(option)``."""
        text = self.message
        for opt in self.options:
            text = text.replace("{" + opt + "}", name(opt))
        return text

    def __str__(self) -> str:
        return self.render()


class InputError(CactusError, ValueError):
    """Invalid input: fix the request (HTTP 400, exit code 1)."""

    exit_code = 1
    http_status = 400
    error_type = "invalid_request_error"


class CapacityError(CactusError):
    """Valid input that does not fit the context, the memory or the engine's queue."""

    exit_code = 2
    http_status = 503
    error_type = "server_error"


class ContextLengthError(CapacityError, ValueError):
    """The prompt does not fit in the context (n_ctx): HTTP 400 as OpenAI answers it."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None, options: Iterable[str] = (),
                 n_prompt_tokens: int | None = None, n_ctx: int | None = None) -> None:
        super().__init__(message, param=param, options=options)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx  # tokens; llama-server reports both


class EngineBusyError(CapacityError):
    """The engine is serving another generation and the caller asked not to wait."""

    http_status = 503
    code = "engine_busy"


class EngineError(CactusError, RuntimeError):
    """llama.cpp or the native helper failed: not the caller's fault (HTTP 500, exit code 3)."""

    exit_code = 3
    http_status = 500
