"""The panel as its tests and its benchmark run it: ``pkrt panel`` as a process of its own, and a
real browser (Debian's Chromium, ``/usr/bin/chromium``, driven by Playwright for Python, whose
own browser download is not used). Chromium runs as root here, hence ``--no-sandbox``; the
other flags keep it off the network (the machines have none) and quiet; Playwright gives each
launch a fresh profile (``--user-data-dir`` of its own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

from pkrt.rt.core.errors import UserError

CHROMIUM = os.environ.get("PKRT_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def start_panel(socket_path: str, programs: str | None = None, *extra: str) -> tuple[subprocess.Popen, dict]:
    """``pkrt panel --port 0 --json`` started; the process and its start line (url, port)."""
    args = [sys.executable, "-m", "pkrt.rt.cli", "panel", "--socket", socket_path, "--port", "0", "--json", *extra]
    if programs is not None:
        args += ["--programs", programs]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise UserError(f"pkrt panel did not start: {proc.stderr.read().strip()}")
    return proc, json.loads(line)


def stop_panel(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()
    return proc.returncode


def versions() -> dict:
    """Playwright's version and the browser's (``chromium --version``), or why there is none."""
    try:
        pw = version("playwright")
    except PackageNotFoundError:
        pw = None
    exe = shutil.which(CHROMIUM) or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    browser = None
    if exe:
        r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        browser = r.stdout.strip() or None
    return {"playwright": pw, "chromium": browser, "executable": exe}


def launch(playwright):
    """Chromium launched headless through a started ``sync_playwright()``."""
    v = versions()
    if v["executable"] is None:
        raise UserError(f"no browser at {CHROMIUM} (apt-get install -y chromium)")
    return playwright.chromium.launch(executable_path=v["executable"], args=FLAGS)


def session_cookie(url: str) -> str:
    """The panel's one-time token (in ``url``) exchanged for its cookie: the ``Cookie`` header."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("GET", f"{u.path}?{u.query}")
        r = conn.getresponse()
        cookie = r.getheader("set-cookie")
        if r.status != 303 or not cookie:
            raise UserError(f"{u.hostname}:{u.port}: the token was refused ({r.status})")
        return cookie.split(";", 1)[0]
    finally:
        conn.close()


def page_socket(url: str, cookie: str):
    """A WebSocket to the panel as its page opens it (this panel's Origin, the session cookie);
    a ``websockets.sync`` connection."""
    from urllib.parse import urlsplit

    from websockets.sync.client import connect

    u = urlsplit(url)
    base = f"{u.hostname}:{u.port}"
    return connect(f"ws://{base}/ws", origin=f"http://{base}", additional_headers={"Cookie": cookie})
