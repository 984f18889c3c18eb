"""The ``cactus-gguf`` command group and what its subcommands share: one-line errors and their
exit codes, the Ctrl-C / SIGTERM bridge, :func:`model_command` and
:func:`models_from_arguments`. The subcommands (bench.py,
models.py, run.py, serve.py) import it from here, and the package (__init__.py) imports them, so
no module imports the package it is part of.
"""
from __future__ import annotations

import _thread
import errno
import functools
import logging
import os
import signal
import sys
import threading

import click

from ..errors import CactusError
from .params import flag_of

__all__ = ["main", "fail", "report_error", "exit_interrupted", "interrupt_pending"]

_terminated = threading.Event()  # a SIGTERM arrived: exit 143, not 130
_interrupt_pending = threading.Event()  # a Ctrl-C / SIGTERM landed inside llama.cpp's decode


# Libraries whose DEBUG / INFO lines are not cactus-gguf's decisions: kept to their warnings under -v
# (filelock: an acquire and a release line per cache lock; asyncio: the server's event loop's
# selector; the HTTP stacks: each connection)
QUIET_LIBRARIES = ("filelock", "asyncio", "sse_starlette", "urllib3", "httpx", "httpcore")


def configure_logging(verbose: int) -> None:
    """``-v`` (1): cactus-gguf's decision log (its module loggers, DEBUG) on stderr, other
    libraries' warnings only (``QUIET_LIBRARIES``); ``-vv`` (2 or more): llama.cpp's log too (the
    ``cactus_gguf.llama_cpp`` logger, llama/log.py)."""
    if verbose <= 0:
        return
    logging.basicConfig(level=logging.DEBUG, format="%(message)s")
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("cactus_gguf.llama_cpp").setLevel(
        logging.DEBUG if verbose >= 2 else logging.CRITICAL + 1)


def fail(message: str, code: int = 1) -> None:
    """One line on stderr, then exit: the only way the CLI reports an error."""
    click.echo(f"cactus-gguf: error: {' '.join(str(message).split())}", err=True)
    raise SystemExit(code)


def report_error(e: BaseException) -> None:
    """Exit with ``e`` as one line, options named by their flags, and its kind's exit code."""
    if isinstance(e, CactusError):
        fail(e.render(flag_of), e.exit_code)
    fail(str(e), 1)


def exit_interrupted(hint: str = "") -> None:
    """After a Ctrl-C or a SIGTERM was handled (the partial result printed): one line on stderr,
    ``cactus-gguf: interrupted`` / ``terminated`` + ``hint``, and the exit code, 130 or 143
    (128 + the signal number, as a shell reports a process the signal ended)."""
    if _terminated.is_set():
        click.echo(f"cactus-gguf: terminated{hint}", err=True)
        raise SystemExit(128 + signal.SIGTERM)
    click.echo(f"cactus-gguf: interrupted{hint}", err=True)
    raise SystemExit(128 + signal.SIGINT)


def _sigterm(signum: int, frame) -> None:
    """SIGTERM (``timeout``, systemd, docker, a desktop app stopping its child) is handled as a
    Ctrl-C, so what was generated is kept (``--json`` still prints the partial object); the exit
    code then says which it was."""
    _terminated.set()
    _sigint(signum, frame)


def interrupt_pending() -> bool:
    """Whether a Ctrl-C or SIGTERM arrived inside llama.cpp's abort callback (while a prompt
    chunk was being decoded): the run asks it there, stops the decode at its next graph node and
    then ends as a Ctrl-C does (plan.execute_run)."""
    return _interrupt_pending.is_set()


def _sigint(signum: int, frame) -> None:
    """Python's default SIGINT behaviour (raise KeyboardInterrupt), except inside llama.cpp's
    callbacks: an exception raised there cannot cross llama.cpp's C frames (ctypes prints
    "Exception ignored" and drops it, so the Ctrl-C would be lost and the model load or
    generation would go on). Inside the abort callback of a prompt's decode (llama/abort.py) it
    is recorded for :func:`interrupt_pending`, which that callback asks next: the decode stops
    within one graph node instead of finishing its chunk. Inside the log callback, and inside
    the library's critical sections (building llama-cpp-python's wrappers, which an interrupt
    would leave half-built), the interrupt is posted again 10 ms later, from a timer thread
    (posting it from here would re-enter this handler at once); it fires once control is back in
    ordinary Python code."""
    from ..llama.abort import in_abort_check
    from ..llama.log import in_critical_section, in_log_callback

    if in_abort_check(frame):
        _interrupt_pending.set()
        return
    if in_log_callback(frame) or in_critical_section():
        again = threading.Timer(0.01, _thread.interrupt_main)
        again.daemon = True
        again.start()
        return
    raise KeyboardInterrupt


def install_sigint_bridge() -> None:
    """Install :func:`_sigint` where nobody chose another SIGINT handler, and :func:`_sigterm`
    where SIGTERM has its default action (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _sigint)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm)


class _OneLineErrors(click.Group):
    """click's group, except that option errors (`-k abc`, an unknown flag) are reported like every
    other input error: one line on stderr, exit code 1; Ctrl-C exits with 130."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # embedded (e.g. click's test runner asked for raw exceptions)
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        install_sigint_bridge()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.ClickException as e:
            if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                e.show()  # bare `cactus-gguf`: the help text
                raise SystemExit(e.exit_code) from None
            fail(e.format_message())
        except click.exceptions.Abort:  # Ctrl-C outside generation (generation handles its own)
            exit_interrupted()
        except OSError as e:
            if e.errno != errno.EPIPE:
                _internal(e)
            # stdout closed early (`| head`): stop quietly, and keep Python's exit-time flush quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        except CactusError as e:
            report_error(e)
        except Exception as e:  # noqa: BLE001 - a bug: still one line, never a traceback
            _internal(e)
        raise SystemExit(rv if isinstance(rv, int) else 0)


def _internal(e: BaseException) -> None:
    """An error nobody anticipated (a bug): one line, exit code 3; CACTUS_GGUF_DEBUG=1 shows the
    traceback instead."""
    if os.environ.get("CACTUS_GGUF_DEBUG"):
        raise e
    fail(f"internal error: {type(e).__name__}: {e} (a bug: please report it; CACTUS_GGUF_DEBUG=1 "
         "shows the traceback)", 3)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cactus-gguf")
def main() -> None:
    """Cactus constrained-acceptance speculative decoding for GGUF models."""


def models_from_arguments(values: dict, verifier, draft) -> None:
    """Positional models fill the slots -m / -md left open, in order (llama.cpp users write -m)."""
    extra = [m for m in (verifier, draft) if m is not None]
    for slot in ("model", "model_draft"):
        if values.get(slot) is None and extra:
            values[slot] = extra.pop(0)
    if extra:
        fail(f"too many model arguments ({extra[0]!r} is left over): give VERIFIER and DRAFT once, "
             "as arguments or with -m / -md")


def _report_rpc_loss(error: CactusError) -> None:
    """An RPC server lost inside a llama.cpp call on the main thread (llama/devices.py: nothing can
    be raised there): the one-line error, then the exit code at once."""
    sys.stdout.flush()
    sys.stderr.write(f"cactus-gguf: error: {error}\n")
    sys.stderr.flush()
    os._exit(error.exit_code)


def report_rpc_loss() -> None:
    """Make a lost RPC server the CLI's one-line error (a command given RPC servers)."""
    from ..llama.devices import set_loss_handler

    set_loss_handler(_report_rpc_loss)


def model_command(name: str, *, grid: bool = False):
    """Decorator: the subcommand ``name`` taking ``[VERIFIER] [DRAFT]`` and its options from
    the options table (grid options as comma-separated lists with ``grid``); the function gets the
    click
    context, the two positional models and the options by name."""
    from .params import schema_options

    def decorate(f):
        def command(ctx: click.Context, verifier, draft, **options):
            if options.get("rpc") or options.get("rpc_draft"):
                report_rpc_loss()
            if options.get("list_devices"):  # every model command: print them, load nothing
                return _list_devices(ctx, name, verifier, draft)
            return f(ctx, verifier, draft, **options)

        functools.update_wrapper(command, f)
        c = schema_options(name, grid=grid)(click.pass_context(command))
        c = click.argument("verifier", required=False)(click.argument("draft", required=False)(c))
        return main.command(name, context_settings={"show_default": True})(c)
    return decorate


def _list_devices(ctx: click.Context, command: str, verifier, draft) -> None:
    """``--list-devices``: this build's backends and devices, and which the models would use;
    every option is validated first, as ``command`` would (a bad one: the usual one-line error)."""
    from ..app import plan as planner
    from ..llama.placement import device_report
    from .params import given

    values = given(ctx)
    models_from_arguments(values, verifier, draft)
    try:
        if command == "bench":
            from ..bench import plan_bench

            load = plan_bench(values, warmup=False).load
        else:
            load = planner.load_of(values, command)
        lines = device_report(load, name=lambda n: flag_of(n).split('/')[0])
    except (CactusError, OSError) as e:
        report_error(e)
    for line in lines:
        click.echo(line)

