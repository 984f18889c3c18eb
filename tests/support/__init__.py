"""Helpers of the tests (no tests here): ``tiny_gguf`` the one GGUF writer, ``harness`` engines /
CLI / KV shadows / memory trends on tiny models, ``stats`` the distribution checks, ``server`` a live
``cactus-gguf serve``, ``llama_build`` llama.cpp built with another backend (Vulkan, CUDA, RPC),
``rpc`` rpc-server processes, ``system_packages`` Debian packages installed when missing."""
