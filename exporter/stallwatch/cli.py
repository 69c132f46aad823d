"""The `stallwatch` command: flags and sub-commands only (serve, the default; check-config FILE; diagnose; version).
What runs is built by `app`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from collections.abc import Sequence

import psutil

from stallwatch import __version__, app
from stallwatch import config as config_module
from stallwatch.collectors import REGISTRY, sections, with_details
from stallwatch.config import Config
from stallwatch.config import web as webconfig
from stallwatch.config.reader import ConfigError
from stallwatch.config.units import parse_duration
from stallwatch.report import oneshot, render
from stallwatch.report.observe import UnknownServer
from stallwatch.web.server import Limits

DEFAULT_PORT = 9847
log = logging.getLogger("stallwatch")


def _add_global_flags(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The flags that hold for every sub-command. Each sub-command takes them too, so that they may stand on either
    side of it (`stallwatch diagnose --config.file F`, as with kubectl and promtool); there they default to
    nothing, so that a flag given before the sub-command is not reset by the sub-command's default."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--web.listen-address", dest="listen_address", default=default(f":{DEFAULT_PORT}"),
                        help=f"address to serve metrics on (default :{DEFAULT_PORT})")
    parser.add_argument("--web.telemetry-path", dest="telemetry_path", default=default("/metrics"),
                        help="path under which to serve metrics (default /metrics)")
    parser.add_argument("--web.write-timeout", dest="write_timeout", default=default("10s"),
                        help="how long a client may take to read one response before its connection is reset "
                             "(default 10s)")
    parser.add_argument("--web.config.file", dest="web_config_file", default=default(None),
                        help="exporter-toolkit web config: TLS, basic auth, response headers (optional)")
    parser.add_argument("--config.file", dest="config_file", default=default(None),
                        help="YAML config file (optional)")
    parser.add_argument("--path.procfs", dest="procfs", default=default(None),
                        help="procfs mountpoint (default /proc; config paths.procfs)")
    parser.add_argument("--path.rootfs", dest="rootfs", default=default(None),
                        help="the node's root filesystem, e.g. /host in a container (default /; config paths.rootfs)")
    parser.add_argument("--log.level", dest="log_level", default=default("info"),
                        choices=("debug", "info", "warn", "error"), help="log level (default info)")
    for registration in REGISTRY:
        name = registration.name
        parser.add_argument(f"--collector.{name}", dest=f"collector_{name}", default=default(None),
                            action=argparse.BooleanOptionalAction,
                            help=f"{registration.help} (default: the config's {name}.enabled, true)")
        parser.add_argument(f"--collector.{name}.details", dest=f"collector_{name}_details", default=default(None),
                            action=argparse.BooleanOptionalAction,
                            help=f"the {name} collector's detail families, read by no shipped rule or panel, and its "
                                 f"duration (default: the config's {name}.details, false)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stallwatch", description="Prometheus exporter that catches silent stalls of LLM inference servers.")
    _add_global_flags(parser, defaults=True)
    parser.add_argument("--version", action="version", version=f"stallwatch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{serve,check-config,diagnose,version}")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        _add_global_flags(sub, defaults=False)
        return sub

    command("serve", "serve metrics (the default)")
    check = command("check-config", "validate a config file; exit 0 or 2")
    check.add_argument("file")
    diagnose = command(
        "diagnose", "report on each watched server (or SERVER) now: phase, GPUs, processes, stacks, port, "
                    "log, verdict; exit 0 healthy, starting or stopped, 1 stalled, failed or down, 2 bad input")
    diagnose.add_argument("server", nargs="?", help="the server's name (default: every watched server); one whose "
                                                    "process is gone is asked of the exporter at --web.listen-address")
    diagnose.add_argument("--json", action="store_true", help="one JSON document (diagnose.schema.json)")
    diagnose.add_argument("--window", type=float, default=2.0,
                          help="seconds over which CPU and token progress are sampled (default 2)")
    command("version", "print the version")
    return parser


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--web.listen-address: expected [host]:port, got {text!r}")
    return host.strip("[]"), int(port)  # "" (":9847"): every address, IPv4 and IPv6


def _write_timeout(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise ValueError(f"--web.write-timeout: expected a duration above 0 like 10s, got {text!r}")
    return seconds


def _with_path_flags(config: Config, args: argparse.Namespace) -> Config:
    """`--path.*` flags override the config's `paths`; psutil reads processes under the same procfs."""
    paths = config.paths
    for flag, key in ((args.procfs, "procfs"), (args.rootfs, "rootfs")):
        if flag is not None:
            if not flag.startswith("/"):
                raise ValueError(f"--path.{key}: expected an absolute path, got {flag!r}")
            paths = dataclasses.replace(paths, **{key: flag.rstrip("/") or "/"})
    psutil.PROCFS_PATH = paths.procfs
    return dataclasses.replace(config, paths=paths)


def _diagnose(config: Config, args: argparse.Namespace) -> int:
    if not 0 < args.window <= 60:
        raise ValueError(f"--window: expected seconds in (0, 60], got {args.window}")
    host, port = _listen_address(args.listen_address)
    # The exporter of this node, for a server whose process is gone: on loopback where it listens on every address.
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    exporter = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    report = oneshot.gather(app.oneshot(config), args.server, args.window, exporter)
    text = render.render_json(report) if args.json else render.render_text(report)
    sys.stdout.write(text.rstrip("\n") + "\n")
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper().replace("WARN", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "version":
        print(f"stallwatch {__version__}")
        return 0
    try:
        if args.command == "check-config":
            config_module.load(args.file, sections())
            print(f"{args.file}: OK")
            return 0
        config = config_module.load(args.config_file, sections()) if args.config_file else Config()
        config = _with_path_flags(config, args)
        config = with_details(config, {r.name: getattr(args, f"collector_{r.name}_details") for r in REGISTRY})
        if args.command == "diagnose":
            return _diagnose(config, args)
        host, port = _listen_address(args.listen_address)
        limits = Limits(write_timeout=_write_timeout(args.write_timeout))
        web_config = webconfig.load(args.web_config_file) if args.web_config_file else None
    except (ConfigError, ValueError, UnknownServer) as exc:
        print(f"stallwatch: error: {exc}", file=sys.stderr)
        return 2

    runtime = app.build(config, {r.name: getattr(args, f"collector_{r.name}") for r in REGISTRY})
    try:
        httpd = app.serve(runtime, host, port, args.telemetry_path, web_config, limits)
    except OSError as exc:
        print(f"stallwatch: error: cannot listen on {args.listen_address}: {exc}", file=sys.stderr)
        return 1
    log.info("stallwatch %s listening on %s:%d%s%s", __version__, host or "*", httpd.server_port,
             args.telemetry_path, " (TLS)" if httpd.tls is not None else "")

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down")
    httpd.shutdown()
    runtime.stop()
    return 0
