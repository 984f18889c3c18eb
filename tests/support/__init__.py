"""Helpers of the tests (no tests here): ``tiny_gguf`` the one GGUF writer, ``harness`` engines /
CLI / KV shadows / memory trends on tiny models, ``stats`` the distribution checks, ``recurrent``
the rollback check of a recurrent state, ``server`` a live ``cactus-gguf serve``, ``tools`` chat
templates with tools and tool schemas, ``rule`` the speculation settings expected, ``llama_build``
llama.cpp built with another backend (Vulkan, CUDA, RPC), ``rpc`` rpc-server processes,
``system_packages`` Debian packages installed when missing. A test file imports these, never
another test file (tests/test_layers.py checks it)."""
