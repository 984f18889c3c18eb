"""Which backends and devices this llama.cpp build has, which a model would use, and where a loaded
model's layers went.

- :func:`device_report`: the lines of ``--list-devices`` (llama.cpp's flag): every backend the
  build registered, every device with its type and memory, and the devices the verifier's and the
  draft's offloaded layers would go to under the given options (``-ngl``, ``--device``, ``--rpc``),
  decided as llama.cpp's model loader decides (src/llama.cpp ``llama_prepare_model_devices``: RPC
  servers first, then the GPUs, the integrated GPUs only when there is no other GPU).
- :class:`LayerPlacement`: where one loaded model's layers are, as llama.cpp's loader reported it
  (its ``load_tensors: layer N assigned to device D`` log lines, one per repeating layer and one
  for the output layer: L + 1 "layers" in all, as llama.cpp counts in ``offloaded 29/29 layers``).
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import llama_cpp

from ..errors import CapacityError
from . import devices
from .devices import DEV_CPU, DEV_GPU, DEV_IGPU, all_devices, dev_description, dev_name, ggml_fn
from .hw import physical_memory

_P = ctypes.c_void_p

__all__ = ["LayerPlacement", "device_report", "device_memory", "parse_layer_lines", "devices_key",
           "kv_shares", "on_lavapipe", "KvCacheTooLargeError", "check_kv_cache_fits"]

_DEV_ACCEL = 3  # enum ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL
_TYPE_NAMES = {DEV_CPU: "CPU", DEV_GPU: "GPU", DEV_IGPU: "integrated GPU",
               _DEV_ACCEL: "accelerator"}

# llama-model.cpp load_tensors (LLAMA_LOG_DEBUG), once per layer il = 0 .. L (L: the output layer)
_LAYER_LINE = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")


@dataclass(frozen=True)
class LayerPlacement:
    """The device of each of a model's L + 1 layers (``devices[L]``: the output layer), as names
    (``CPU``, ``Vulkan0``, ``CUDA0``, ``RPC0``...)."""

    devices: tuple[str, ...]

    @property
    def n_layers(self) -> int:
        return len(self.devices)

    @property
    def n_offloaded(self) -> int:
        return sum(d != "CPU" for d in self.devices)

    def counts(self) -> dict[str, int]:
        """Layers per device, offload devices first in the order their layers come, CPU last."""
        out: dict[str, int] = {}
        for d in sorted(self.devices, key=lambda d: d == "CPU"):
            out[d] = out.get(d, 0) + 1
        return out

    def summary(self) -> str:
        """``29/29 layers on Vulkan0``, ``10/29 layers on Vulkan0, 19 on CPU``, ``0/29 layers
        offloaded (CPU)``."""
        counts = self.counts()
        cpu = counts.pop("CPU", 0)
        if not counts:
            return f"0/{self.n_layers} layers offloaded (CPU)"
        where = (next(iter(counts)) if len(counts) == 1
                 else " + ".join(f"{d} ({n})" for d, n in counts.items()))
        return (f"{self.n_offloaded}/{self.n_layers} layers on {where}"
                + (f", {cpu} on CPU" if cpu else ""))

    def as_dict(self) -> dict:
        """The ``--json`` form: layers (L + 1), offloaded, layers per device, the output layer's
        device."""
        return {"layers": self.n_layers, "offloaded": self.n_offloaded, "devices": self.counts(),
                "output": self.devices[-1], "summary": self.summary()}


def devices_key(*placements: "LayerPlacement | None") -> str:
    """The devices holding these placements' layers, each with its description and layer count
    (``Vulkan0=llvmpipe (LLVM 15.0.6, 256 bits):29``): what a forward-cost measurement depends on
    beyond the CPU (llama.cpp's system info names the CPU's features only, the same for a CPU
    and a GPU build)."""
    described = {dev_name(d): dev_description(d) for d in all_devices()}
    return "; ".join(",".join(f"{name}={described.get(name, '?')}:{n}"
                              for name, n in p.counts().items())
                     if p is not None else "unknown" for p in placements)


def kv_shares(placement: "LayerPlacement", kv_bytes: int) -> list[tuple[str, str, int, int]]:
    """Where a KV cache of ``kv_bytes`` goes: llama.cpp keeps each layer's keys and values on its
    layer's device, so an offload device holds its share of the repeating layers. Returns
    (name, description, bytes of KV it would hold, bytes free now) per device other than the
    CPU (the CPU's share is host memory: Context checks the machine's)."""
    repeating = placement.devices[:-1]  # the last "layer" is the output layer: no KV
    by_name = {dev_name(d): d for d in all_devices()}
    out = []
    for name in dict.fromkeys(d for d in repeating if d != "CPU"):
        dev = by_name.get(name)
        if dev is None:
            continue
        free, total = device_memory(dev)
        if total:  # a device that reports no memory is not checked
            share = kv_bytes * sum(d == name for d in repeating) // max(1, len(repeating))
            out.append((name, dev_description(dev), share, free))
    return out


def on_lavapipe(placement: "LayerPlacement") -> bool:
    """Whether layers of this placement run on Mesa's lavapipe, the software Vulkan device (it
    describes itself as ``llvmpipe (LLVM ...)``). A lavapipe device this model does not use (beside
    a real GPU, say) does not count."""
    described = {dev_name(d): dev_description(d) for d in all_devices()}
    lavapipe = {name for name, what in described.items() if what.startswith("llvmpipe")}
    return any(d in lavapipe for d in placement.devices)


def parse_layer_lines(lines: Sequence[str]) -> LayerPlacement | None:
    """The placement from llama.cpp's ``layer N assigned to device D`` lines of one load (None
    when there are none, or they do not cover layers 0 .. L exactly once: another llama.cpp)."""
    found: dict[int, str] = {}
    for line in lines:
        m = _LAYER_LINE.search(line)
        if m:
            found[int(m.group(1))] = m.group(2)
    if not found or sorted(found) != list(range(len(found))):
        return None
    return LayerPlacement(tuple(found[i] for i in range(len(found))))


# ------------------------------------------------------------------------------------------------
# --list-devices
# ------------------------------------------------------------------------------------------------

def device_memory(dev) -> tuple[int, int]:
    """(free, total) bytes of a ggml device, as its backend reports them (0, 0: it reports none)."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    ggml_fn("ggml_backend_dev_memory", None, [_P, ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(ctypes.c_size_t)])(
        dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def _dev_type(dev) -> int:
    return ggml_fn("ggml_backend_dev_type", ctypes.c_int, [_P])(dev)


def _backends() -> list[str]:
    count = ggml_fn("ggml_backend_reg_count", ctypes.c_size_t, [])()
    get = ggml_fn("ggml_backend_reg_get", _P, [ctypes.c_size_t])
    name = ggml_fn("ggml_backend_reg_name", ctypes.c_char_p, [_P])
    return [(name(get(i)) or b"?").decode() for i in range(count)]


def _default_devices() -> list:
    """The devices llama.cpp gives a model when none are named: RPC servers first, then the
    GPUs, then the integrated GPUs only if there is no other GPU (src/llama.cpp)."""
    everything = all_devices()
    rpc = [d for d in everything if devices.is_rpc_device(d)]
    gpus = [d for d in everything if not devices.is_rpc_device(d) and _dev_type(d) == DEV_GPU]
    igpus = [d for d in everything if _dev_type(d) == DEV_IGPU]
    return rpc + gpus + ([] if gpus else igpus)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _would_use(role: str, flags: tuple[str, str], n_gpu_layers: int, device: str | None,
               rpc: str | None, param_device: str, param_rpc: str) -> str:
    """One model's line: the devices its offloaded layers would go to, in llama.cpp's order
    (``flags``: how the line names the layer-count and device options)."""
    chosen = devices.device_list(device, rpc, param_device=param_device, param_rpc=param_rpc)
    devs = [d for d in chosen if d] if chosen is not None else _default_devices()
    layers_flag, device_flag = flags
    if n_gpu_layers == 0 or not devs:
        why = (f"{layers_flag} 0" if n_gpu_layers == 0 else
               f"{device_flag} none" if device is not None else "no offload device in this build")
        return f"{role}: CPU only ({why})"
    layers = "all layers" if n_gpu_layers < 0 else f"up to {n_gpu_layers} layers"
    return (f"{role} ({layers_flag} {n_gpu_layers}: {layers}): "
            + ", ".join(dev_name(d) for d in devs))


def device_report(load, *, with_draft: bool = True,
                  name: Callable[[str], str] = lambda n: n) -> list[str]:
    """The ``--list-devices`` lines for the load options ``load`` (a LoadOptions): this build's
    backends, every device (name, description, type, memory free / total) and the devices the
    verifier (and, ``with_draft``, the draft) would offload to; ``name`` spells an option (API
    name by default; the CLI passes its flags). RPC servers of ``rpc`` / ``rpc_draft`` are probed
    and registered first (RpcError when one does not answer)."""
    from . import log

    log.init_backend()
    # first, as it registers the RPC servers: they are devices too
    verifier = _would_use("verifier", (name("n_gpu_layers"), name("device")), load.n_gpu_layers,
                          load.device, load.rpc, "device", "rpc")
    draft = (_would_use("draft", (name("n_gpu_layers_draft"), name("device_draft")),
                        load.n_gpu_layers_draft, load.device_draft, load.rpc_draft,
                        "device_draft", "rpc_draft") if with_draft else None)
    lines = [f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) backends: "
             + ", ".join(_backends()), "devices:"]
    for d in all_devices():
        free, total = device_memory(d)
        memory = f"{_mib(total)}, {_mib(free)} free" if total else "memory not reported"
        kind = "RPC server" if devices.is_rpc_device(d) else _TYPE_NAMES.get(_dev_type(d), "?")
        lines.append(f"  {dev_name(d)}: {dev_description(d)} ({kind}; {memory})")
    lines.append(verifier)
    if draft is not None:
        lines.append(draft)
    return lines


class KvCacheTooLargeError(CapacityError):
    """The KV cache of the requested n_ctx would not fit in the machine's memory."""

    exit_code = 2



def check_kv_cache_fits(n_ctx: int, kv_bytes: int, placement: LayerPlacement | None,
                        model_name: str) -> None:
    """Raise KvCacheTooLargeError when a KV cache of ``n_ctx`` tokens, ``kv_bytes`` bytes
    (Model.kv_cache_bytes), is larger than the machine's memory, or a device's share of it under
    ``placement`` (None: all on the CPU) than that device's free memory. ``model_name`` names the
    model in the message."""
    # A KV cache larger than the machine's memory is not an error in llama.cpp: it allocates
    # (or spends minutes trying) until the OOM killer ends the process. Refuse it up front.
    ram = physical_memory()
    if ram and kv_bytes > ram:
        raise KvCacheTooLargeError(
            f"{{n_ctx}}={n_ctx} needs about {kv_bytes / 2**30:.1f} GiB of KV cache for "
            f"{model_name}, more than this machine's {ram / 2**30:.1f} GiB of memory: "
            "lower {n_ctx}", param="n_ctx")
    # ... and a device's share larger than its free memory (ggml's figure for it, after the
    # weights): llama.cpp would fail to allocate it (or, on a driver that oversubscribes,
    # page it to and fro); llama.cpp's own `--fit` would shrink the context instead
    for name, description, share, free in (kv_shares(placement, kv_bytes)
                                             if placement is not None else ()):
        if share > free:
            raise KvCacheTooLargeError(
                f"{{n_ctx}}={n_ctx} needs about {share / 2**30:.1f} GiB of KV cache on "
                f"{name} ({description}) for {model_name}, more than its "
                f"{free / 2**30:.1f} GiB free: lower {{n_ctx}} (or offload fewer layers)",
                param="n_ctx")
