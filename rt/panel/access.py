"""Who may use the operator panel: a random one-time token, printed as a URL at start and
exchanged for a session cookie (HttpOnly, SameSite=Strict); the Host header of every request
and the Origin of the WebSocket (and of the emergency stop's POST) checked against an
allowlist (a page of another site, or a DNS-rebound name, is refused)."""

from __future__ import annotations

import hmac
import secrets

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
WILDCARD = ("0.0.0.0", "::", "")


def host_names(bind: str, port: int, extra: list[str] | None = None) -> set[str]:
    """The Host header values accepted: loopback names, the bound address (unless a wildcard)
    and the ``extra`` names (``name`` or ``name:port``), each with the port."""
    names = set(LOOPBACK)
    if bind not in WILDCARD:
        names.add(f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind)
    out = {f"{n}:{port}" for n in names}
    for e in extra or []:
        out.add(e if e.rsplit(":", 1)[-1].isdigit() and not e.endswith("]") else f"{e}:{port}")
    return out


class Access:
    """The panel's token, its sessions and its allowlists (one per panel process: nothing of
    it outlives the process; a restarted panel prints a new URL)."""

    def __init__(self, bind: str, port: int, extra_hosts: list[str] | None = None):
        self.port = port
        self.token: str | None = secrets.token_urlsafe(24)
        self.hosts = host_names(bind, port, extra_hosts)
        self.origins = {f"http://{h}" for h in self.hosts}
        self.cookie = f"pkrt_panel_{port}"  # one per port: cookies are shared by every port of a host
        self._sessions: set[str] = set()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/?token={self.token}"

    def exchange(self, token: str) -> str | None:
        """A session for the one-time token (then used up), None for any other value."""
        if self.token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        self.token = None
        session = secrets.token_urlsafe(32)
        self._sessions.add(session)
        return session

    def session_ok(self, value: str | None) -> bool:
        return bool(value) and any(hmac.compare_digest(value.encode(), s.encode()) for s in self._sessions)

    def host_ok(self, host: str | None) -> bool:
        return host is not None and host.lower() in self.hosts

    def origin_ok(self, origin: str | None) -> bool:
        return origin is not None and origin.lower() in self.origins

    def refusal(self, headers, cookies: dict, need_origin: bool) -> str | None:
        """Why a request is refused (None: allowed): its Host, its Origin (``need_origin``:
        the WebSocket and the POST), its session cookie."""
        if not self.host_ok(headers.get("host")):
            return f"Host {headers.get('host')!r} is not one of this panel's names"
        if need_origin and not self.origin_ok(headers.get("origin")):
            return f"Origin {headers.get('origin')!r} is not this panel"
        if not self.session_ok(cookies.get(self.cookie)):
            return "no session: open the URL that pkrt panel printed at start"
        return None
