"""Loading an engine's models: GGUF paths or registry names, the RPC servers checked first, each
model's offload and context options from the LoadOptions, and how the pair's vocabularies relate.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..llama import Context, ContextOptions, ModelOptions
from ..llama.devices import check_servers
from ..options import LoadOptions
from .foreign import PairVocab

__all__ = ["load_pair", "model_path"]


def model_path(name: str | Path, param: str) -> Path:
    """A GGUF path, or a models.yaml name resolved (fetched on first use) through the registry.
    Raises ModelLoadError (``param``: the option that gave it) when it is neither."""
    from ..llama import ModelLoadError

    path = Path(name)
    if path.exists() or path.suffix == ".gguf" or "/" in str(name):
        return path
    from .. import registry

    if str(name) in registry.load_registry().models:
        return registry.resolve_model(str(name))
    raise ModelLoadError(f"model file not found: {name} (nor a registry name: `cactus-gguf "
                         "models` lists them)", param=param)


def _load(name: str | Path, param: str, model_options: ModelOptions,
          context_options: ContextOptions) -> Context:
    """Context.load of a model path or name; a ModelLoadError names the option that gave it."""
    from ..llama import ModelLoadError

    try:
        return Context.load(model_path(name, param), model_options, context_options)
    except ModelLoadError as e:
        if e.param is None:
            e.param, e.options = param, (param, *e.options)
        raise


def load_pair(verifier: str | Path, draft: str | Path | None, lo: LoadOptions, *,
              draft_context: ContextOptions | None = None,
              repack: bool | None = None, load_mtp: bool = False
              ) -> tuple[Context, Context | None, PairVocab | None]:
    """The verifier's context, the draft's and how their vocabularies relate (both None without
    a draft), loaded with ``lo``'s options (``draft_context``: the draft's own context options,
    default the verifier's; ``repack`` overrides ``lo.repack`` for both). Raises ModelLoadError,
    VocabMismatchError (a draft that shares no text token with the verifier),
    KvCacheTooLargeError, RPC server errors; nothing stays loaded after an error. ``load_mtp``:
    the verifier's next-n (MTP) layers too (``--drafter mtp``)."""
    repack = repack if repack is not None else lo.repack
    ctx_opts = ContextOptions(n_ctx=lo.n_ctx, n_batch=lo.n_batch, n_threads=lo.n_threads,
                              flash_attn=lo.flash_attn, n_parallel=lo.n_parallel,
                              kv_unified=lo.kv_unified)
    check_servers(rpc=lo.rpc, rpc_draft=lo.rpc_draft if draft is not None else None)
    ver = dft = pair = None
    try:
        ver = _load(verifier, "model",
                    ModelOptions(lo.n_gpu_layers, repack=repack, device=lo.device, rpc=lo.rpc,
                                 tensor_split=lo.tensor_split, load_mtp=load_mtp),
                    ctx_opts)
        if draft is not None:
            dft = _load(draft, "model_draft",
                        ModelOptions(lo.n_gpu_layers_draft, repack=repack, device=lo.device_draft,
                                     rpc=lo.rpc_draft,
                                     option_names=("device_draft", "rpc_draft", "tensor_split")),
                        # a draft's rollbacks span one-token decodes: checkpoints, not snapshots
                        dataclasses.replace(draft_context or ctx_opts, n_rs_seq=0,
                                            n_parallel=lo.n_parallel, kv_unified=lo.kv_unified))
            pair = PairVocab.of(ver.model, dft.model)
    except BaseException:
        for c in (dft, ver):  # contexts before models, the draft first (as Engine.close)
            if c is not None:
                c.close()
        raise
    return ver, dft, pair
