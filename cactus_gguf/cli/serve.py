"""``cactus-gguf serve``: the OpenAI-compatible server over one engine.

SIGTERM and Ctrl-C stop it gracefully: no new connections, waiting requests refused (503), the
running one given ``SHUTDOWN_GRACE`` seconds to finish (a stream it then ends gets an error event,
never a silent end), the models freed; exit code 0. A second Ctrl-C quits at once.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
from typing import TYPE_CHECKING

import click

from ..errors import CactusError
from .group import configure_logging, fail, model_command, models_from_arguments, report_error
from .params import flag_of, given

if TYPE_CHECKING:
    import uvicorn

    from ..app.plan import ServePlan
    from ..server.worker import Worker


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@model_command("serve")
def serve(ctx: click.Context, verifier, draft, **_options) -> None:
    """Serve VERIFIER (checking DRAFT's proposals) over the OpenAI HTTP API.

    The run options are the defaults of every request; a request's own fields (temperature,
    max_tokens, stop, seed, "speculative": {...}) override them. With neither model, the
    registry's default pair is served.
    """
    _require_server_extras()
    from ..app import plan as planner
    from ..server.worker import Worker

    plan = _serve_plan(ctx, verifier, draft)
    p = plan.settings
    if not _loopback(p["host"]) and not p["api_key"]:
        click.echo(f"cactus-gguf: warning: listening on {p['host']} without --api-key: anyone who "
                   "can reach this address can use the server", err=True)
    sock = _bind(p["host"], p["port"])
    worker = Worker(lambda: planner.open_engine(plan.run, probe=True), max_queue=p["max_queue"])
    server = _http_server(plan, worker)
    host, port = sock.getsockname()[:2]
    worker.start()
    threading.Thread(target=_announce, args=(worker, server, plan.model_id, host, port),
                     daemon=True).start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        worker.stop()
    if worker.state == "failed":
        raise SystemExit(1)
    click.echo("cactus-gguf: stopped", err=True)


def _require_server_extras() -> None:
    """Exit with a one-line install hint when the server's extra packages are missing."""
    try:
        import uvicorn  # noqa: F401

        from ..server.app import ServerConfig, create_app  # noqa: F401
        from ..server.worker import Worker  # noqa: F401
    except ImportError as e:
        fail(f"the server needs its extra packages ({e.name} is missing): "
             "pip install 'cactus-gguf[server]'")


def _serve_plan(ctx: click.Context, verifier, draft) -> ServePlan:
    """The ServePlan of the command line (models, run options, server settings), before any
    model loads; an error exits with one line."""
    from ..app import plan as planner

    values = given(ctx)
    models_from_arguments(values, verifier, draft)
    configure_logging(values.get("verbose", 0))
    try:
        return planner.plan_serve(values)
    except (CactusError, OSError) as e:
        report_error(e)


def _http_server(plan: ServePlan, worker: Worker) -> uvicorn.Server:
    """The uvicorn server of the app over ``worker``, its requests defaulting to ``plan``'s. Its
    SIGINT / SIGTERM handler first shuts the engine's side down (waiting jobs refused, the
    running one given its grace)."""
    import uvicorn

    from ..server.app import ServerConfig, create_app

    p = plan.settings
    config = ServerConfig(defaults=plan.run.request, model_id=plan.model_id,
                          verifier=plan.run.verifier_spec, draft=plan.run.draft_spec,
                          api_key=p["api_key"], strict_model=p["strict_model"],
                          request_timeout=p["request_timeout"],
                          cors_origins=tuple(p["cors_origin"]),
                          slots=p["slots"], slot_save_path=p["slot_save_path"], ui=p["ui"])
    app = create_app(worker, config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # SIGINT / SIGTERM, in the main thread
            if not self.should_exit:
                app.state.shutdown()  # the engine's side: refuse waiting jobs, end the running one
            super().handle_exit(sig, frame)

    # uvicorn waits this long for open connections (the running request's grace, then its last
    # event; the streams' own wait is shutdown_grace + 5 s, app.py) before it cancels them
    return Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                 timeout_graceful_shutdown=config.shutdown_grace + 15))


def _announce(worker: Worker, server: uvicorn.Server, model_id: str, host: str,
              port: int) -> None:
    """Once the worker has loaded the models (run in a thread): the address served on stderr, or
    the load's error, and then the server told to exit."""
    worker.ready.wait()
    if worker.state == "ready":
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"cactus-gguf: serving {model_id} at http://{shown}:{port} "
                   "(OpenAI API under /v1, chat page at /)", err=True)
    else:
        e = worker.exception
        shown = e.render(flag_of) if isinstance(e, CactusError) else worker.error
        click.echo(f"cactus-gguf: error: {shown}", err=True)
        server.should_exit = True


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the models load, so the port is known (``--port 0``)
    and a taken one is a one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        fail(f"cannot listen on {host}:{port}: {e.strerror or e} (choose another --host/--port)")
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
