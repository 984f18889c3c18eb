"""The OpenAI-compatible server (``cactus-gguf serve``; needs ``pip install 'cactus-gguf[server]'``).

- ``schemas``: the request bodies (OpenAI's fields, llama.cpp's extensions, ``speculative``) and
  how they become an engine Request through cactus_gguf/options/;
- ``worker``: the one thread that owns the engine and serves jobs in arrival order;
- ``app``: the FastAPI routes, OpenAI's response / chunk / error shapes, SSE streaming;
- ``metrics``: Prometheus metrics; ``static/``: the chat page served at ``/``.
"""
