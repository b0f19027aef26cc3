"""`gpupool k8s ...`: the device plugin, the scheduler extender and the webhook."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import typer

from gpupool.cli import options
from gpupool.core.errors import ConfigError, InvalidRequest
from gpupool.k8s.names import DEFAULT_TRUSTED
from gpupool.k8s.podshare import DEFAULT_KEY_FILE
from gpupool.scheduler.names import DEFAULT_POLICY, POLICY_NAMES, check_policy

k8s_app = typer.Typer(help="Kubernetes: device plugin, scheduler extender, webhook.")


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"invalid --listen {text!r}: use HOST:PORT, e.g. 127.0.0.1:8888")
    return host or "127.0.0.1", int(port)


def _require_extra() -> None:
    """The k8s commands need the k8s extra; without it, one line says how to get it."""
    import importlib.util

    missing = [
        m for m in ("grpc", "kubernetes", "fastapi", "uvicorn") if not importlib.util.find_spec(m)
    ]
    if missing:
        raise ConfigError(
            f"the Kubernetes commands need {', '.join(missing)}: pip install 'gpupool[k8s]'"
        )


def _logging() -> None:
    _require_extra()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")


def _serve(app: Any, listen: str, cert: Path | None = None, key: Path | None = None) -> None:
    import uvicorn

    host, port = _listen(listen)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        ssl_certfile=str(cert) if cert else None,
        ssl_keyfile=str(key) if key else None,
    )


@k8s_app.command("device-plugin")
def device_plugin(
    simulate: str | None = options.typer_option(options.SIMULATE),
    kubelet_dir: Path = typer.Option(
        Path("/var/lib/kubelet/device-plugins"),
        "--kubelet-dir",
        metavar="DIR",
        help="Where kubelet.sock is and where the plugin puts its socket.",
    ),
    state_dir: Path = typer.Option(
        Path("/var/lib/gpupool/k8s"),
        "--state-dir",
        metavar="DIR",
        help="Host directory for the containers' shim.conf and accounting regions.",
    ),
    lib_dir: Path = typer.Option(
        Path("/var/lib/gpupool/lib"),
        "--lib-dir",
        metavar="DIR",
        help="Host directory where the containers' library is installed, one subdirectory per "
        "version.",
    ),
    node_name: str | None = typer.Option(
        None,
        "--node-name",
        help="This node's name, as the Node object spells it (default: $NODE_NAME, else the "
        "host name).",
    ),
    key_file: Path = typer.Option(
        DEFAULT_KEY_FILE, "--key-file", metavar="FILE", help="The extender's signing key."
    ),
) -> None:
    """Run the kubelet device plugin for gpupool.io/gpu on this node."""
    from gpupool.devices.factory import open_backend
    from gpupool.k8s import hostfiles
    from gpupool.k8s.allocation import SIM_NODE_DIR, ShareFiles
    from gpupool.k8s.deviceplugin import DevicePlugin, default_node_name
    from gpupool.k8s.kubeclient import OfficialKube
    from gpupool.k8s.podshare import load_key

    _logging()
    if not kubelet_dir.is_dir():
        raise InvalidRequest(f"invalid --kubelet-dir {kubelet_dir}: not a directory")
    key = load_key(key_file)
    files = ShareFiles(state_dir, hostfiles.install(lib_dir))
    api = OfficialKube()
    with open_backend(simulate, state_dir / SIM_NODE_DIR if simulate else None) as backend:
        if backend.simulated:
            typer.echo(f"gpupool: simulated node {simulate}: no real GPU is used", err=True)
        plugin = DevicePlugin(
            api, node_name or default_node_name(), backend, kubelet_dir, files, key
        )
        signal.signal(signal.SIGTERM, lambda *_: plugin.stop())
        try:
            plugin.run()
        except KeyboardInterrupt:
            plugin.stop()


@k8s_app.command("extender")
def extender(
    listen: str = typer.Option(
        "127.0.0.1:8888",
        "--listen",
        metavar="HOST:PORT",
        help="Where to serve; /bind answers loopback peers only (kube-scheduler in this pod).",
    ),
    policy: str = typer.Option(
        DEFAULT_POLICY, "--policy", help=f"Placement policy: {', '.join(POLICY_NAMES)}."
    ),
    resync: float = typer.Option(
        30.0, "--resync", metavar="SECONDS", help="How often to re-read nodes and pods."
    ),
    key_file: Path = typer.Option(
        DEFAULT_KEY_FILE,
        "--key-file",
        metavar="FILE",
        help="The key that signs allocations (the device plugins hold the same).",
    ),
) -> None:
    """Run the scheduler extender (filter, prioritize, bind) over HTTP."""
    from gpupool.k8s.extender import Extender
    from gpupool.k8s.extender_http import create_app
    from gpupool.k8s.kubeclient import OfficialKube
    from gpupool.k8s.podshare import load_key

    _logging()
    _listen(listen)
    check_policy(policy)
    if resync <= 0:
        raise InvalidRequest(f"invalid --resync {resync}: must be positive")
    key = load_key(key_file)
    ext = Extender(OfficialKube(), policy, key)
    ext.start_background(resync)
    _serve(create_app(ext), listen)


@k8s_app.command("webhook")
def webhook(
    listen: str = typer.Option("127.0.0.1:8443", "--listen", metavar="HOST:PORT"),
    tls_cert: Path | None = typer.Option(
        None, "--tls-cert", metavar="FILE", help="PEM certificate (required)."
    ),
    tls_key: Path | None = typer.Option(
        None, "--tls-key", metavar="FILE", help="PEM private key (required)."
    ),
    scheduler: str = typer.Option("gpupool-scheduler", "--scheduler-name"),
    trusted: list[str] = typer.Option(
        list(DEFAULT_TRUSTED),
        "--trusted-user",
        metavar="USER",
        help="Who may change a pod's gpupool.io annotations (the extender's and the device "
        "plugin's service accounts); repeat for each.",
    ),
) -> None:
    """Run the admission webhook: gpupool pods go to gpupool's scheduler, forged shares are
    refused. It serves HTTPS only (the API server calls webhooks over TLS)."""
    from gpupool.k8s.webhook import create_app

    _logging()
    _listen(listen)
    if tls_cert is None or tls_key is None:
        raise InvalidRequest(
            "the webhook serves HTTPS only (the API server calls webhooks over TLS): give "
            "--tls-cert and --tls-key"
        )
    for path in (tls_cert, tls_key):
        if not path.is_file():
            raise InvalidRequest(f"invalid TLS file {path}: not found")
    _serve(create_app(scheduler, frozenset(trusted)), listen, tls_cert, tls_key)


def register(app: typer.Typer) -> None:
    """Add `k8s` to the app."""
    app.add_typer(k8s_app, name="k8s")
