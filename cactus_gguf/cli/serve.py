"""``cactus-gguf serve``: the OpenAI-compatible server over one engine.

SIGTERM and Ctrl-C stop it gracefully: no new connections, waiting requests refused (503), the
running one given ``SHUTDOWN_GRACE`` seconds to finish (a stream it then ends gets an error event,
never a silent end), the models freed; exit code 0. A second Ctrl-C quits at once.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import threading
from typing import TYPE_CHECKING, Mapping

import click

from ..errors import CactusError
from .group import configure_logging, fail, model_command, models_from_arguments, report_error
from .params import flag_of, given

if TYPE_CHECKING:
    import uvicorn

    from ..app.plan import ServePlan
    from ..server.app import GcpCompat
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
    gcp = _gcp_compat(os.environ)
    port = gcp.port if gcp is not None else p["port"]
    for host in p["hosts"]:
        if not _loopback(host) and not p["api_key"]:
            click.echo(f"cactus-gguf: warning: listening on {host} without --api-key: anyone who "
                       "can reach this address can use the server", err=True)
    socks = [_bind(host, port) for host in p["hosts"]]
    sleep = p["sleep_idle_seconds"]
    worker = Worker(lambda: planner.open_engine(plan.run, probe=True), max_queue=p["max_queue"],
                    sleep_idle=None if sleep == -1 else float(sleep))
    server = _http_server(plan, worker, gcp, given(ctx).get("verbose", 0))
    addresses = [sock.getsockname()[:2] for sock in socks]
    worker.start()
    threading.Thread(target=_announce, args=(worker, server, plan.model_id, addresses),
                     daemon=True).start()
    try:
        server.run(sockets=socks)
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


def _gcp_compat(env: Mapping[str, str]) -> GcpCompat | None:
    """Google Vertex AI's custom-container contract, as llama-server reads it: with
    ``AIP_MODE=PREDICTION``, the port is ``AIP_HTTP_PORT`` (default 8080, replacing ``--port``),
    ``POST AIP_PREDICT_ROUTE`` (default ``/predict``) answers a batch of ``instances``, and
    ``AIP_HEALTH_ROUTE`` (when set) is a second health route. None without ``AIP_MODE``."""
    from ..server.app import GcpCompat

    if env.get("AIP_MODE") != "PREDICTION":
        return None

    def route(name: str, default: str) -> str:
        value = env.get(name) or default
        return value if not value or value.startswith("/") else "/" + value

    text = env.get("AIP_HTTP_PORT") or "8080"
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        fail(f"AIP_HTTP_PORT must be a port number (0 to 65535), got {text!r}")
    return GcpCompat(port=int(text), predict_route=route("AIP_PREDICT_ROUTE", "/predict"),
                     health_route=route("AIP_HEALTH_ROUTE", ""))


def _http_server(plan: ServePlan, worker: Worker, gcp: GcpCompat | None,
                 verbose: int = 0) -> uvicorn.Server:
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
                          slots=p["slots"], slot_save_path=p["slot_save_path"], ui=p["ui"],
                          n_parallel=plan.run.load.n_parallel,
                          metrics=p["metrics"], aliases=plan.aliases, tags=plan.tags, gcp=gcp,
                          verbose=verbose > 0)
    app = create_app(worker, config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # SIGINT / SIGTERM, in the main thread
            if not self.should_exit:
                app.state.shutdown()  # the engine's side: refuse waiting jobs, end the running one
            super().handle_exit(sig, frame)

    # uvicorn waits this long for open connections (the running request's grace, then its last
    # event; the streams' own wait is shutdown_grace + 5 s, app.py) before it cancels them
    # http="h11": it writes header names as the app spells them (llama-server's spelling,
    # server/cors.py), where httptools would lower-case them
    return Server(uvicorn.Config(app, log_level="warning", lifespan="off", http="h11",
                                 timeout_graceful_shutdown=config.shutdown_grace + 15))


def _announce(worker: Worker, server: uvicorn.Server, model_id: str,
              addresses: list[tuple[str, int]]) -> None:
    """Once the worker has loaded the models (run in a thread): the addresses served on stderr,
    or the load's error, and then the server told to exit."""
    worker.ready.wait()
    if worker.state == "ready":
        urls = " and ".join(f"http://{f'[{host}]' if ':' in host else host}:{port}"
                            for host, port in addresses)
        click.echo(f"cactus-gguf: serving {model_id} at {urls} "
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
