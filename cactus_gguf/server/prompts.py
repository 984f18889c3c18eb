"""A chat body's prompt text, as the engine decodes it: the GGUF's chat template with the body's
tools (server/tools.py) or with its template switches (``add_generation_prompt``, a final
assistant message continued). One function for the routes that render without generating
(``/apply-template``, the token counts), so that what they show is what a chat decodes."""
from __future__ import annotations

from .schemas import ChatCompletionRequest, chat_format, chat_messages, to_request
from .tools import ToolPlan

__all__ = ["chat_prompt"]


def chat_prompt(engine, body: ChatCompletionRequest, defaults) -> str:
    """The prompt text of ``body`` on ``engine`` (``defaults``: the server's default Request).
    Raises InputError for a body the template or the options refuse."""
    tools = ToolPlan.of(body)
    if tools is not None:
        return tools.prepare(engine, to_request(defaults, body))[0]
    return engine.format_chat(chat_messages(body), **chat_format(body))
