"""One GGUF model: load options, loading, vocabulary facts, text <-> token ids, chat template.

Weights and vocabulary come from ``llama_cpp._internals.LlamaModel`` (the owning wrapper
llama-cpp-python builds its ``Llama`` class on); everything else calls the C functions directly.
Contexts (KV cache, decoding) are in ``context.py``; a model outlives its contexts.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp
from llama_cpp import _internals

from ..errors import EngineError, InputError
from ..options import check_value, default
from . import devices, log
from .hw import build_has_amx, cpu_has_amx
from .placement import LayerPlacement, parse_layer_lines

__all__ = ["ModelOptions", "ModelLoadError", "Model", "AttentionShape", "check_gguf_path"]


@dataclass(frozen=True)
class AttentionShape:
    """One model's attention: query and KV heads, key and value head sizes (elements)."""

    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int


class ModelLoadError(InputError):
    """A GGUF file could not be loaded (missing, not GGUF, truncated, unsupported architecture)."""


@dataclass(frozen=True)
class ModelOptions:
    """How to load a GGUF file.

    n_gpu_layers: layers to offload to the GPU (llama.cpp ``-ngl``); -1 = all, 0 = CPU only.
        Ignored by CPU-only builds of llama.cpp.
    use_mmap: memory-map the file instead of reading it into memory.
    repack: allow llama.cpp's extra buffer types (weight repacking for faster CPU kernels).
        None = automatic: on, except when both the CPU and the llama.cpp build have AMX, where
        repacking Q4_K weights into AMX buffers segfaults (llama.cpp issue #20824).
    device: the devices the offloaded layers go to (llama.cpp ``--device``: comma-separated
        names, ``none`` = CPU only); None = this machine's GPUs, then the ``rpc`` servers.
    rpc: RPC servers for the offloaded layers, ``HOST:PORT[,...]`` (llama.cpp ``--rpc``).
    tensor_split: proportions of the offloaded layers per device, ``3,1`` (``--tensor-split``).
    load_mtp: also load the model's next-n (MTP) layers, for ``--drafter mtp`` (llama.cpp's
        ``load_mtp``; a model without them loads as it is).
    The option names of the error messages are ``option_names``' (a draft's are ``*_draft``).
    """

    n_gpu_layers: int = default("n_gpu_layers")
    use_mmap: bool = True
    repack: bool | None = None
    device: str | None = None
    rpc: str | None = None
    tensor_split: str | None = None
    option_names: tuple[str, str, str] = ("device", "rpc", "tensor_split")
    load_mtp: bool = False

    def __post_init__(self) -> None:
        check_value("n_gpu_layers", self.n_gpu_layers)

    def resolved_repack(self) -> bool:
        if self.repack is not None:
            return self.repack
        return not (cpu_has_amx() and build_has_amx())


def check_gguf_path(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` names a readable GGUF file before llama.cpp sees it.

    Raises ModelLoadError (one line) for a missing path, a directory or a file without the GGUF magic.
    """
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory: give the path of a .gguf file")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read {p}: {e.strerror}") from None
    if magic != b"GGUF":
        raise ModelLoadError(f"{p} is not a GGUF file (no GGUF magic): convert it with llama.cpp's "
                             "convert_hf_to_gguf.py or download a .gguf")
    return p


class Model:
    """A loaded GGUF model: weights and vocabulary. ``close()`` frees it (after its contexts).

    Token ids are int in [0, n_vocab). Raises ModelLoadError when the file cannot be loaded.
    """

    def __init__(self, path: str | os.PathLike[str], options: ModelOptions = ModelOptions()) -> None:
        log.init_backend()
        self.path = check_gguf_path(path)
        self.template_override: str | None = None  # a chat template used instead of the GGUF's
        self._model: _internals.LlamaModel | None = None
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = options.n_gpu_layers if options.n_gpu_layers >= 0 else 999
        mparams.load_mode = (llama_cpp.LLAMA_LOAD_MODE_MMAP if options.use_mmap
                             else llama_cpp.LLAMA_LOAD_MODE_NONE)
        mparams.use_extra_bufts = options.resolved_repack()
        mparams.load_mtp = options.load_mtp
        self.mtp_loaded = options.load_mtp
        dev_name, rpc_name, _ = options.option_names
        # kept referenced: llama.cpp reads both arrays while it loads
        self._devices = devices.device_list(options.device, options.rpc, param_device=dev_name,
                                            param_rpc=rpc_name)
        self._tensor_split = devices.tensor_split(options.tensor_split)
        if self._devices is not None:
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if self._tensor_split is not None:
            mparams.tensor_split = self._tensor_split
        #: layers on an RPC server: llama.cpp calls go through devices.rpc_call
        self.remote = devices.uses_rpc(self._devices)
        log.clear_errors()
        try:
            with log.critical(), log.capture() as lines:
                self._model = devices.call(self.remote, lambda: _internals.LlamaModel(
                    path_model=str(self.path), params=mparams, verbose=True))
        except ValueError:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {log.last_error()}") from None
        #: where the layers went (llama.cpp's own account of this load); None if it gave none
        self.placement: LayerPlacement | None = parse_layer_lines(lines)
        if self.remote:
            devices.abandon_on_loss(self._abandon)
        self.ptr = self._model.model
        self.vocab = self._model.vocab
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(self.ptr)
        # one piece buffer per thread: the server detokenizes (/detokenize, /tokenize's pieces)
        # on its HTTP side while the engine's thread decodes
        self._piece_bufs = threading.local()

    def _abandon(self) -> None:
        """After a lost RPC server: never free (llama.cpp would wait for the dead server)."""
        if self._model is not None:
            self._model._exit_stack = contextlib.ExitStack()

    def close(self) -> None:
        """Free the weights. Idempotent."""
        if self._model is not None:
            devices.free(self.remote, self._model.close)
            self._model = None

    @property
    def closed(self) -> bool:
        return self._model is None

    # -- facts -------------------------------------------------------------------------------------

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None when the key is absent."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        """The Jinja chat template: ``template_override`` when set (``--chat-template-file``),
        else the GGUF's default (``tokenizer.chat_template``), or None."""
        if self.template_override is not None:
            return self.template_override
        ptr = llama_cpp.llama_model_chat_template(self.ptr, None)
        return ptr.decode("utf-8") if ptr else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def attention_shape(self) -> AttentionShape:
        """Query / KV heads and the K / V head sizes: the GGUF's ``key_length`` /
        ``value_length`` when it has them, else n_embd / n_head (llama.cpp's default)."""
        n_head = max(1, llama_cpp.llama_model_n_head(self.ptr))
        default = llama_cpp.llama_model_n_embd(self.ptr) // n_head
        arch = self.metadata("general.architecture") or ""
        k, v = (self.metadata(f"{arch}.attention.{key}_length") for key in ("key", "value"))
        return AttentionShape(n_head, llama_cpp.llama_model_n_head_kv(self.ptr),
                              int(k) if k else default, int(v) if v else default)

    @property
    def n_layer_nextn(self) -> int:
        """Next-n (MTP) layers the GGUF has (0: none; ``--drafter mtp`` needs one)."""
        return max(0, llama_cpp.llama_model_n_layer_nextn(self.ptr))

    @property
    def n_embd_out(self) -> int:
        """Width of the hidden rows next-n drafting hands from the verifier to its MTP layer."""
        return llama_cpp.llama_model_n_embd_out(self.ptr)

    @property
    def recurrent(self) -> bool:
        """The model keeps a recurrent state (Mamba-2, gated delta-net, short convolutions, RWKV),
        alone or beside attention (a hybrid): llama.cpp's own predicates. Its rollback is by
        snapshots or checkpoints (rollback.py), not by cutting a KV cache."""
        return bool(llama_cpp.llama_model_is_recurrent(self.ptr)
                    or llama_cpp.llama_model_is_hybrid(self.ptr))

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """Estimated size of an f16 KV cache of ``n_ctx`` tokens, bytes:
        n_ctx x layers x KV heads x (K + V head sizes) x 2 bytes."""
        a = self.attention_shape
        return (n_ctx * llama_cpp.llama_model_n_layer(self.ptr) * a.n_head_kv
                * (a.head_k + a.head_v) * 2)

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)

    @property
    def eot(self) -> int:
        return llama_cpp.llama_vocab_eot(self.vocab)

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    @property
    def vocab_type(self) -> int:
        return llama_cpp.llama_vocab_type(self.vocab)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, and the model's other EOG ids)."""
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of ``token`` as stored in the GGUF (not detokenized)."""
        return llama_cpp.llama_vocab_get_text(self.vocab, token) or b""

    def token_attr(self, token: int) -> int:
        return llama_cpp.llama_vocab_get_attr(self.vocab, token)

    # -- text <-> tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for ``text``; ``add_special`` adds BOS where the model wants it."""
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special,
                                         parse_special)
            if n < 0:
                raise EngineError(f"llama_tokenize failed ({n}) for a {len(data)}-byte text")
        return list(buf[:n])

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes ``token`` contributes to the text (may be part of a UTF-8 character)."""
        buf = getattr(self._piece_bufs, "buf", None)
        if buf is None:
            buf = self._piece_bufs.buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:  # piece longer than the buffer: -n bytes are needed
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special=special) for t in tokens).decode(
            "utf-8", errors="replace")
