"""CLI verb ``pkrt panel``: the operator's web page for a served machine, in a process of its
own (``pkrt.rt.panel``), a client of the machine's control socket."""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import socket
import sys
from pathlib import Path

from pkrt.rt.cli.argtypes import positive_number
from pkrt.rt.core.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", help="the served machine's control socket (default: as pkrt serve's)")
    p.add_argument("--port", type=int, default=8765, help="TCP port of the page (default: %(default)s; 0: a free one)")
    p.add_argument("--bind", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, loopback only; another address exposes the "
                        "machine's controls to that network)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept this Host name (NAME or NAME:PORT; repeatable), e.g. the machine's host name "
                        "with --bind")
    p.add_argument("--programs", metavar="DIR", help="directory of the programs (CSV, G-code) the page may run")
    p.add_argument("--poll-hz", type=positive_number, default=20.0,
                   help="status requests per second to the machine, whatever the number of pages (default: "
                        "%(default)s, the pages' update rate)")
    p.add_argument("--json", action="store_true", help="print the start line (URL, port) as one JSON object")


def _listen(bind: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
    except ValueError:
        raise UserError(f"--bind: expected an IP address, got '{bind}'") from None
    if not 0 <= port < 65536:
        raise UserError(f"--port: expected 0..65535, got {port}")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # no Nagle: a small update after a reply would otherwise wait for the page's delayed ACK (~40 ms);
    # the accepted connections inherit it
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((bind, port))
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {bind}:{port}: {e.strerror}") from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def run(args) -> int:
    try:
        import uvicorn

        from pkrt.rt.panel.app import Panel
    except ImportError as e:
        raise UserError(f"pkrt panel needs its extra ({e.name} is missing): pip install 'pkrt[panel]'") from None
    from pkrt.rt.app.serve import default_socket

    if args.programs is not None and not Path(args.programs).is_dir():
        raise UserError(f"--programs: {args.programs}: not a directory")
    sock = _listen(args.bind, args.port)
    port = sock.getsockname()[1]
    path = args.socket or default_socket()
    panel = Panel(path, args.programs, args.bind, port, args.allow_host, poll_hz=args.poll_hz)
    url = panel.access.url("127.0.0.1" if args.bind in ("0.0.0.0", "127.0.0.1") else
                           (f"[{args.bind}]" if ":" in args.bind else args.bind))
    if args.json:
        print(json.dumps({"url": url, "port": port, "bind": args.bind, "socket": path}), flush=True)
    else:
        print(f"pkrt panel: {url}", flush=True)
        print(f"pkrt panel: machine at {path}; open the URL once (its token is used once, then a cookie); "
              f"Ctrl-C ends the panel (the machine keeps running)", file=sys.stderr, flush=True)
    config = uvicorn.Config(panel.app, log_level="warning", access_log=False, ws="auto", lifespan="on",
                            ws_per_message_deflate=False, timeout_graceful_shutdown=3)
    # uvicorn ends on SIGINT, SIGTERM, SIGHUP and raises the signal again once shut down: to these
    # handlers, so that the panel ends with status 0 (the machine is not touched)
    saved = {s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        for s, old in saved.items():
            signal.signal(s, old)
    return 0


VERBS = {"panel": (add_arguments, run)}
