"""Where a model's layers go: llama.cpp's backend devices, its RPC servers, a lost RPC server.

llama.cpp's RPC backend (ggml-rpc) makes a remote ``rpc-server`` look like one more device; a model
offloads layers to it as to a GPU (``-ngl``), split across devices by ``--tensor-split``. This module
does what llama.cpp's ``--rpc`` / ``--device`` / ``--tensor-split`` do in common/arg.cpp, through
ggml's registry functions (ctypes on the libggml that llama-cpp-python loaded):

- :func:`device_list`: the NULL-terminated ``ggml_backend_dev_t`` array of ``llama_model_params.devices``
  for one model: the devices named by ``--device``, else the machine's GPUs plus the RPC servers given
  to *this* model (``--rpc`` for the verifier, ``--rpc-draft`` for the draft). Every server is checked
  first (:func:`probe`: TCP connect and ggml-rpc's HELLO, a few seconds at most), because ggml-rpc
  aborts the process on a server it cannot reach.
- :func:`tensor_split`: the ``float[llama_max_devices()]`` of ``llama_model_params.tensor_split``.
- A server that dies later, mid-generation: ggml-rpc calls ``GGML_ABORT`` on its dispatcher thread
  (ggml-rpc.cpp ``RPC_STATUS_ASSERT``). :func:`rpc_call` runs each llama.cpp call of a model on RPC
  devices on one worker thread; the abort callback installed here parks the aborting thread instead
  of letting ggml call ``abort()``, and the waiting caller raises :class:`RpcServerLostError`. The
  parked threads never return, so the contexts of every model on RPC devices are abandoned, not
  freed (freeing them would wait for the dead server), and the process ends with
  ``os._exit(3)`` at interpreter exit (C++ static destructors would join the parked thread).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import queue
import socket
import struct
import sys
import threading
import weakref
from typing import Any, Callable, Sequence

import llama_cpp

from ..errors import EngineError, InputError
from ..options import parse_endpoints, parse_tensor_split

__all__ = ["RpcError", "RpcServerLostError", "probe", "check_servers", "device_list",
           "tensor_split", "check_tensor_split", "call", "free", "rpc_call", "rpc_lost",
           "abandon_on_loss", "list_devices", "set_loss_handler", "all_devices", "dev_name",
           "dev_description", "is_rpc_device", "ggml_fn", "DEV_CPU", "DEV_GPU", "DEV_IGPU"]

# ggml-rpc's wire format (ggml/src/ggml-rpc/ggml-rpc.cpp of the vendored llama.cpp): a command byte,
# a uint64 payload size, the payload; the answer is a uint64 size and its payload. HELLO is command
# 14 in every protocol version; its request is 24 bytes of transport capabilities (zero: plain TCP),
# its answer major, minor, patch, padding and 24 bytes of capabilities.
_RPC_CMD_HELLO = 14
_HELLO_REQ_SIZE = 24
_HELLO_RSP_SIZE = 28
_RPC_PROTO_MAJOR, _RPC_PROTO_MINOR = 7, 0  # ggml-rpc.h; the client refuses minor > its own
PROBE_TIMEOUT = 3.0  # seconds, connect and handshake each

# enum ggml_backend_dev_type (ggml-backend.h)
DEV_CPU, DEV_GPU, DEV_IGPU = 0, 1, 2


class RpcError(InputError):
    """An RPC server cannot be used: malformed address, nothing listening, another protocol
    version, or a llama.cpp build without RPC (exit code 1, HTTP 400)."""


class RpcServerLostError(EngineError):
    """An RPC server stopped answering while a model on it was in use (exit code 3, HTTP 503).
    The engine cannot continue; the text generated so far is kept by the caller."""

    http_status = 503
    code = "rpc_server_lost"


# ------------------------------------------------------------------------------------------------
# Is a server there?
# ------------------------------------------------------------------------------------------------

def probe(endpoint: str, param: str = "rpc", timeout: float = PROBE_TIMEOUT) -> None:
    """Check that an rpc-server of this llama.cpp's protocol answers at ``endpoint`` (HOST:PORT):
    connect, send HELLO, read the version, close. At most ~2 x ``timeout`` seconds.

    Raises RpcError (one line, naming the address) when nothing listens, the server does not
    answer the handshake (rpc-server serves one client at a time: another client may hold it) or
    speaks another protocol version.
    """
    host, _, port = endpoint.rpartition(":")
    hint = (f"start it there with `rpc-server -H {host} -p {port}` (built from llama-cpp-python "
            f"{llama_cpp.__version__}'s vendored llama.cpp)")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise RpcError(f"no RPC server at {endpoint} ({{{param}}}): {reason}; {hint}",
                       param=param) from None
    try:
        sock.settimeout(timeout)
        sock.sendall(struct.pack("<BQ", _RPC_CMD_HELLO, _HELLO_REQ_SIZE) + bytes(_HELLO_REQ_SIZE))
        head = _recv_exact(sock, 8)
        size = struct.unpack("<Q", head)[0] if head else 0
        body = _recv_exact(sock, size) if 3 <= size <= 4096 else b""
    except OSError:
        head = body = b""
    finally:
        sock.close()
    if len(body) < 3:
        raise RpcError(f"the server at {endpoint} ({{{param}}}) did not answer ggml-rpc's handshake "
                       f"within {timeout:g} s: it is not an rpc-server, another client is using it "
                       f"(it serves one at a time), or it is from another llama.cpp version; {hint}",
                       param=param)
    major, minor, patch = body[0], body[1], body[2]
    if major != _RPC_PROTO_MAJOR or minor > _RPC_PROTO_MINOR:
        raise RpcError(f"the rpc-server at {endpoint} ({{{param}}}) speaks RPC protocol "
                       f"{major}.{minor}.{patch}, this llama.cpp "
                       f"{_RPC_PROTO_MAJOR}.{_RPC_PROTO_MINOR}: {hint}",
                       param=param)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


# ------------------------------------------------------------------------------------------------
# ggml's device registry
# ------------------------------------------------------------------------------------------------

_P = ctypes.c_void_p
_ggml: dict[str, Any] = {}


def ggml_fn(name: str, restype, argtypes):
    """A function of libggml / libggml-base (the copies next to the libllama llama-cpp-python
    loaded, so ``LLAMA_CPP_LIB_PATH`` builds are used consistently)."""
    if name not in _ggml:
        libdir = llama_cpp.llama_cpp._base_path
        for lib in ("libggml.so", "libggml-base.so", "libggml.dylib", "libggml-base.dylib",
                    "ggml.dll", "ggml-base.dll"):
            path = os.path.join(libdir, lib)
            if not os.path.exists(path):
                continue
            f = getattr(ctypes.CDLL(path), name, None)
            if f is not None:
                f.restype, f.argtypes = restype, argtypes
                _ggml[name] = f
                break
        else:
            raise EngineError(f"llama.cpp's libggml in {libdir} has no {name}")
    return _ggml[name]


def dev_name(dev) -> str:
    return (ggml_fn("ggml_backend_dev_name", ctypes.c_char_p, [_P])(dev) or b"").decode()


def dev_description(dev) -> str:
    return (ggml_fn("ggml_backend_dev_description", ctypes.c_char_p, [_P])(dev) or b"").decode()


def all_devices() -> list:
    count = ggml_fn("ggml_backend_dev_count", ctypes.c_size_t, [])()
    get = ggml_fn("ggml_backend_dev_get", _P, [ctypes.c_size_t])
    return [get(i) for i in range(count)]


_rpc_regs: dict[str, list] = {}   # endpoint -> its devices (registered once per process)
_rpc_dev_ptrs: set[int] = set()


def _rpc_devices(endpoint: str, param: str) -> list:
    """The devices of the rpc-server at ``endpoint``, registered with ggml on first use."""
    if endpoint in _rpc_regs:
        return _rpc_regs[endpoint]
    _check_build(param)
    probe(endpoint, param)
    reg_by_name = ggml_fn("ggml_backend_reg_by_name", _P, [ctypes.c_char_p])
    rpc_reg = reg_by_name(b"RPC")
    addr = ggml_fn("ggml_backend_reg_get_proc_address", _P, [_P, ctypes.c_char_p])(
        rpc_reg, b"ggml_backend_rpc_add_server")
    if not addr:
        raise RpcError(f"this llama.cpp's RPC backend has no ggml_backend_rpc_add_server ({{{param}}})",
                       param=param)
    _install_abort_guard()
    add_server = ctypes.CFUNCTYPE(_P, ctypes.c_char_p)(addr)
    reg = add_server(endpoint.encode())
    if not reg:
        raise RpcError(f"the rpc-server at {endpoint} ({{{param}}}) offers no device", param=param)
    ggml_fn("ggml_backend_register", None, [_P])(reg)
    n = ggml_fn("ggml_backend_reg_dev_count", ctypes.c_size_t, [_P])(reg)
    get = ggml_fn("ggml_backend_reg_dev_get", _P, [_P, ctypes.c_size_t])
    devs = [get(reg, i) for i in range(n)]
    _rpc_regs[endpoint] = devs
    _rpc_dev_ptrs.update(devs)
    return devs


def check_servers(**servers: str | None) -> None:
    """Before anything loads: that this build has RPC and every server answers (``name=value``
    per option, e.g. ``rpc="h:50052", rpc_draft=None``). Raises RpcError naming the option."""
    for name, value in servers.items():
        for endpoint in parse_endpoints(value, name) if value else ():
            if endpoint not in _rpc_regs:
                _check_build(name)
                probe(endpoint, name)


def _check_build(param: str) -> None:
    if not llama_cpp.llama_supports_rpc():
        raise RpcError(f"{{{param}}} needs llama.cpp's RPC backend, and this llama-cpp-python "
                       "build has none: reinstall it with `CMAKE_ARGS=\"-DGGML_RPC=on\" pip install "
                       f"--force-reinstall --no-cache-dir llama-cpp-python=={llama_cpp.__version__}`",
                       param=param)


def list_devices() -> list[tuple[str, str]]:
    """(name, description) of every device llama.cpp knows now (CPU, GPUs, registered RPC)."""
    return [(dev_name(d), dev_description(d)) for d in all_devices()]


def device_list(device: str | None, rpc: str | None, *, param_device: str = "device",
                param_rpc: str = "rpc") -> ctypes.Array | None:
    """``llama_model_params.devices`` for one model: a NULL-terminated ``ggml_backend_dev_t[]``, or
    None for llama.cpp's default (every GPU) when neither option is set and no RPC server is
    registered in this process (else the default would also take another model's servers).

    device: comma-separated device names (``--device``; ``none`` = CPU only), e.g. ``CUDA0,RPC0``;
        default: the devices of ``rpc``, then this machine's GPUs (llama.cpp's order).
    rpc: this model's RPC servers, ``HOST:PORT[,...]`` (each probed, then registered).
    Raises RpcError (a server), InputError (an unknown device name, listing the known ones).
    """
    remote = [d for ep in (parse_endpoints(rpc, param_rpc) if rpc else ())
              for d in _rpc_devices(ep, param_rpc)]
    if device is None and rpc is None and not _rpc_regs:
        return None
    if device is not None:
        chosen = []
        if device.strip() != "none":
            by_name = {dev_name(d): d for d in all_devices()}
            for name in (s.strip() for s in device.split(",")):
                if name not in by_name:
                    known = ", ".join(n for n in by_name) or "none"
                    raise InputError(f"{{{param_device}}} {name!r} is not a device of this machine "
                                     f"(known: {known}; `none` = CPU only)", param=param_device)
                if ggml_fn("ggml_backend_dev_type", ctypes.c_int, [_P])(by_name[name]) == DEV_CPU:
                    raise InputError(f"{{{param_device}}} names the CPU ({name}): list only "
                                     "offload devices; layers not offloaded run on the CPU "
                                     "(`none` = CPU only)", param=param_device)
                chosen.append(by_name[name])
    else:
        dev_type = ggml_fn("ggml_backend_dev_type", ctypes.c_int, [_P])
        local = [d for d in all_devices() if d not in _rpc_dev_ptrs
                 and dev_type(d) in (DEV_GPU, DEV_IGPU)]
        chosen = remote + local  # llama.cpp's order (src/llama.cpp): servers first, the output
        # layer on the last device, so the logits need not cross the network
    return (_P * (len(chosen) + 1))(*chosen, None)


def tensor_split(text: str | None) -> ctypes.Array | None:
    """``llama_model_params.tensor_split`` (float[llama_max_devices()]) for ``--tensor-split``."""
    if text is None:
        return None
    values = parse_tensor_split(text)
    n_max = llama_cpp.llama_max_devices()
    if len(values) > n_max:
        raise InputError(f"{{tensor_split}} has {len(values)} values; this llama.cpp takes at most "
                         f"{n_max}", param="tensor_split")
    return (ctypes.c_float * n_max)(*values)


def check_tensor_split(tensor_split: str | None, n_gpu_layers: int, device: str | None,
                       rpc: str | None) -> None:
    """Before anything loads: refuse a ``--tensor-split`` that would have nothing to split, which
    llama.cpp ignores without a word: the verifier offloads no layer (``-ngl 0``, ``--device
    none``) or has no device to offload to (a CPU-only build, no ``--rpc``). Raises InputError
    (param tensor_split)."""
    if tensor_split is None:
        return
    if n_gpu_layers == 0 or (device is not None and device.strip() == "none"):
        why = "{n_gpu_layers} 0 offloads none" if n_gpu_layers == 0 else \
            "{device} none keeps them all on the CPU"
        raise InputError(f"{{tensor_split}} splits the verifier's offloaded layers between "
                         f"devices, and {why}: drop {{tensor_split}}", param="tensor_split",
                         options=("n_gpu_layers" if n_gpu_layers == 0 else "device",))
    if device is None and rpc is None:
        from . import log

        log.init_backend()  # registers the build's backends: their devices are listed after it
        dev_type = ggml_fn("ggml_backend_dev_type", ctypes.c_int, [_P])
        if not any(dev_type(d) in (DEV_GPU, DEV_IGPU) for d in all_devices()):
            raise InputError("{tensor_split} splits the verifier's offloaded layers between "
                             "devices, and this llama.cpp build has none to offload to (CPU only, "
                             "no {rpc}; {list_devices} shows them): drop {tensor_split}, or "
                             "install a GPU build (docs/hardware.md \"Install for your hardware\")",
                             param="tensor_split", options=("rpc", "list_devices"))


def is_rpc_device(dev) -> bool:
    """True for a device of an RPC server (registered by :func:`device_list`)."""
    return dev in _rpc_dev_ptrs


def uses_rpc(devices: ctypes.Array | None) -> bool:
    """True when a model with this device list has layers on an RPC server."""
    return devices is not None and any(d in _rpc_dev_ptrs for d in devices if d)


# ------------------------------------------------------------------------------------------------
# A server lost mid-generation
# ------------------------------------------------------------------------------------------------

_lost = threading.Event()
_lost_message = ""
_lost_text: str | None = None     # the description, computed once
_abandon: list[Callable[[], Callable[[], None] | None]] = []  # weak: run once on loss
_abort_callback = None


def _on_abort(message: bytes) -> None:
    global _lost_message
    text = (message or b"").decode("utf-8", "replace").strip()
    if "RPC" not in text and "connect" not in text:  # not ours: ggml's own report, then abort()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    if not _lost.is_set():
        _lost_message = text.split(": ", 1)[-1]
        # first make every model / context on RPC devices unfreeable, then tell the callers:
        # a caller that raises at once must find nothing left to free
        for ref in _abandon:
            fn = ref()
            if fn is not None:
                fn()
        atexit.register(_exit_without_freeing)
        _lost.set()
    if threading.current_thread() is threading.main_thread():
        # a connection made on the caller's thread (ggml-rpc connects lazily) failed, and nobody
        # else can report it: the error cannot be raised through ggml's C frames (returning lets
        # ggml abort()), so the loss handler reports it and ends the process here
        _loss_handler(RpcServerLostError(_lost_description()))
        os._exit(RpcServerLostError.exit_code)  # a handler that returned
    # ggml-rpc's dispatcher thread (or the RPC worker): park it for good (returning would abort()
    # the process). Every llama.cpp call that can wait for it runs through rpc_call(), whose
    # caller raises now, or the next one does.
    threading.Event().wait()


def _report_loss(error: RpcServerLostError) -> None:
    """The default loss handler: the error as Python reports an uncaught one (its last line), then
    the process ends with the error's exit code."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.write(f"{type(error).__name__}: {error}\n")
        sys.stderr.flush()
    os._exit(error.exit_code)


_loss_handler: Callable[[RpcServerLostError], None] = _report_loss


def set_loss_handler(handler: Callable[[RpcServerLostError], None]) -> None:
    """Who reports an RPC server lost on the main thread (inside a llama.cpp call, where nothing
    can be raised): ``handler(error)`` must end the process (``os._exit``); the CLI's prints its
    one-line error (cli/group.py)."""
    global _loss_handler
    _loss_handler = handler


def _exit_without_freeing() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(RpcServerLostError.exit_code)


def _install_abort_guard() -> None:
    global _abort_callback
    if _abort_callback is None:
        cb_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
        _abort_callback = cb_type(_on_abort)
        ggml_fn("ggml_set_abort_callback", _P, [cb_type])(_abort_callback)


def _lost_description() -> str:
    global _lost_text
    if _lost_text is None:
        dead = [ep for ep in _rpc_regs if not _listening(ep)]
        where = (f"the RPC server at {', '.join(dead)}" if dead
                 else "an RPC server (" + ", ".join(_rpc_regs) + ")")
        _lost_text = (f"{where} stopped answering (llama.cpp: {_lost_message}); restart it and "
                      "cactus-gguf (this process cannot reconnect)")
    return _lost_text


def _listening(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False


def rpc_lost() -> bool:
    """True once an RPC server was lost in this process."""
    return _lost.is_set()


def abandon_on_loss(method: Callable[[], None]) -> None:
    """Call the bound ``method`` (once) when an RPC server is lost, if its object still lives: it
    must make a model / context on RPC devices skip llama.cpp's free (which would wait for the
    dead server forever). Held weakly."""
    _abandon.append(weakref.WeakMethod(method))


class _Worker:
    """One daemon thread that makes the llama.cpp calls of models on RPC devices (load, context
    creation, decode, logits, clear, free), so that the caller can give up on a call the dead
    server will never complete."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="cactus-rpc-calls", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, args, box, done = self._jobs.get()
            try:
                box.append((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box.append((False, e))
            done.set()

    def call(self, fn: Callable, args: Sequence) -> Any:
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, args, box, done))
        interrupted = False
        while True:
            try:
                while not done.wait(0.05):
                    if _lost.is_set():
                        raise RpcServerLostError(_lost_description())
                break
            except KeyboardInterrupt:  # finish the call first: the context must stay consistent
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt
        ok, value = box[0]
        if not ok:
            raise value
        return value


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def call(remote: bool, fn: Callable, *args) -> Any:
    """``fn(*args)``: through :func:`rpc_call` for a model with RPC devices, else directly."""
    return rpc_call(fn, *args) if remote else fn(*args)


def free(remote: bool, fn: Callable[[], None]) -> None:
    """Run a llama.cpp free ``fn`` of a model / context; on RPC devices through the worker, and
    not at all once a server was lost (the object was abandoned: freeing would wait forever)."""
    if not remote:
        fn()
    elif not _lost.is_set():
        with contextlib.suppress(RpcServerLostError):
            rpc_call(fn)


def rpc_call(fn: Callable, *args) -> Any:
    """``fn(*args)`` (a llama.cpp call on a model with RPC devices) on the RPC worker thread.
    Raises RpcServerLostError at once if a server was lost, or as soon as one is lost during the
    call (within 50 ms); a Ctrl-C during the call is raised once the call has returned."""
    global _worker
    if _lost.is_set():
        raise RpcServerLostError(_lost_description())
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
    return _worker.call(fn, args)
