"""The operator panel's web application (Starlette): one page (``/``, its scripts and styles
under ``/static``, shipped with pkrt), one WebSocket (``/ws``) and the emergency stop's own
endpoint (``POST /estop``, for a page whose WebSocket is down).

Page -> panel, one JSON object per frame: ``{"id": n, "cmd": C, ...}`` with C a machine
command forwarded over the page's own connection (``FORWARD``: the machine checks the
arguments and the state), ``run`` with ``program`` (a name from the programs directory, never
a path), ``read`` (a program's text), ``estop`` (straight to the machine on the emergency
stop's connection), ``preview`` (a G-code program's tool-path preview, checked whole in the
panel's process: ``preview``). Panel -> page: ``snapshot`` (the whole view), ``update`` (changed
fields), ``reply`` (to a command: ok, error, the machine's reply), ``error`` (a frame that is not
a command). Every request is refused unless its Host is the panel's; the WebSocket and the POST
also need this panel's Origin and the session cookie (``access``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketClose, WebSocketDisconnect

from pkrt.rt.core.errors import UserError
from pkrt.rt.panel import programs as progs
from pkrt.rt.panel.access import Access
from pkrt.rt.panel.hub import Hub, Page
from pkrt.rt.panel.link import EstopLink, PageLink, Poller
from pkrt.rt.panel.preview import Previews

STATIC = Path(__file__).parent / "static"
FORWARD = ("enable", "disable", "home", "jog", "release", "alive", "move", "hold", "resume", "override", "stop",
           "reset", "ack")
MAX_FRAME = 8192  # bytes: a longer frame from a page is refused
HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class Panel:
    """One panel process' application: ``app`` (ASGI) serves the page; ``socket_path`` is the
    served machine's control socket; ``programs`` the directory of runnable programs."""

    def __init__(self, socket_path: str, programs: str | None, bind: str, port: int,
                 extra_hosts: list[str] | None = None, poll_hz: float = 20.0, readout: bool = True):
        self.socket_path, self.poll_hz, self.readout = socket_path, poll_hz, readout
        self.folder = Path(programs) if programs else None
        self.access = Access(bind, port, extra_hosts)
        self.hub: Hub | None = None
        self.poller: Poller | None = None
        self.estop = EstopLink(socket_path)
        self.previews = Previews()
        routes = [Route("/", self.index), Route("/estop", self.estop_post, methods=["POST"]),
                  WebSocketRoute("/ws", self.ws), Mount("/static", StaticFiles(directory=STATIC), name="static")]
        self.app = Guard(Starlette(routes=routes, lifespan=self._lifespan), self.access)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        self.hub = Hub(asyncio.get_running_loop())
        self.poller = Poller(self.socket_path, self.hub.publish, self.folder, self.poll_hz, self.readout,
                             watched=lambda: bool(self.hub.pages))
        self.poller.start()
        self.estop.start()
        try:
            yield
        finally:
            self.poller.stop()
            self.estop.stop()
            self.previews.close()

    # -- HTTP ---------------------------------------------------------------------------------------
    async def index(self, request: Request):
        token = request.query_params.get("token")
        if token is not None:
            session = self.access.exchange(token)
            if session is None:
                return PlainTextResponse("pkrt panel: this token is not valid (a token is used once; restart "
                                         "pkrt panel for a new URL)\n", status_code=403)
            out = RedirectResponse("/", status_code=303)
            out.set_cookie(self.access.cookie, session, httponly=True, samesite="strict", path="/")
            return out
        if not self.access.session_ok(request.cookies.get(self.access.cookie)):
            return PlainTextResponse("pkrt panel: no session: open the URL that pkrt panel printed at start\n",
                                     status_code=403)
        return FileResponse(STATIC / "panel.html", media_type="text/html")

    async def estop_post(self, request: Request):
        why = self.access.refusal(request.headers, request.cookies, need_origin=True)
        if why is not None:
            return JSONResponse({"ok": False, "error": why}, status_code=403)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.estop.press(lambda r: (loop.call_soon_threadsafe(fut.set_result, r), self.poller.poke()))
        return JSONResponse(await fut)

    # -- WebSocket ----------------------------------------------------------------------------------
    async def ws(self, ws: WebSocket):
        why = self.access.refusal(ws.headers, ws.cookies, need_origin=True)
        if why is not None:
            await ws.close(code=1008, reason=why[:120])
            return
        await ws.accept()
        loop = asyncio.get_running_loop()
        page = Page(ws.send_text)

        def to_page(msg: dict | None) -> None:
            if msg is not None:  # None: a keep-alive that went through
                loop.call_soon_threadsafe(page.reply, msg)

        link = PageLink(self.socket_path, lambda req, r: to_page(reply_of(req, r)), self.poller.poke)
        link.start()
        self.hub.add(page)
        pump = asyncio.create_task(_pumped(page))
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                out = self.handle(msg.get("text"), link, to_page)
                if out is not None:
                    page.reply(out)
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            self.hub.remove(page)
            pump.cancel()
            link.close()  # its connection closes: the machine releases a jog this page started

    def handle(self, text: str | None, link: PageLink, to_page) -> dict | None:
        """One frame from a page: queued, sent, or answered at once (the returned message)."""
        msg, why = parse_frame(text)
        if msg is None:
            return {"type": "error", "error": why}
        rid, cmd = msg.get("id"), msg["cmd"]
        req = {k: v for k, v in msg.items() if k != "id"}
        if cmd == "estop":
            self.estop.press(lambda r: (to_page(reply_of(msg, r)), self.poller.poke()))  # the new state at once
            return None
        try:
            if cmd == "read":
                return reply_of(msg, {"ok": True, "text": progs.text_of(self.folder, progs.resolve(self.folder, msg.get("name")))})
            if cmd == "preview":
                return self.preview(msg, to_page)
            if cmd == "run":
                req = {"cmd": "run", "file": progs.resolve(self.folder, msg.get("program")),
                       **({"speed": msg["speed"]} if "speed" in msg else {})}
            elif cmd not in FORWARD:
                raise UserError(f"unknown command {cmd!r} ({', '.join(FORWARD + ('run', 'read', 'preview', 'estop'))})")
        except UserError as e:
            return reply_of(msg, {"ok": False, "error": str(e)})
        req["_id"] = rid
        if not link.submit(req):
            return reply_of(msg, {"ok": False, "error": "too many commands waiting for the machine"})
        return None

    def preview(self, msg: dict, to_page) -> dict | None:
        """The preview of a listed G-code program, replied when computed (None: later); the demo
        and CSV paths have none."""
        file = progs.resolve(self.folder, msg.get("name"))
        if file == "demo" or file.lower().endswith(".csv"):
            return reply_of(msg, {"ok": True, "file": file, "preview": None})
        if self.poller.config is None:
            raise UserError("machine not reachable: its configuration is not known yet")
        self.previews.get(self.poller.config, file, lambda r: to_page(reply_of(msg, r)))
        return None


def parse_frame(text: str | None) -> tuple[dict | None, str | None]:
    """A page's frame as a command (``{"cmd": str, "id"?, ...}``, None) or (None, why not)."""
    if text is None or len(text) > MAX_FRAME:
        return None, f"a frame must be a JSON object as text of at most {MAX_FRAME} bytes"
    try:
        msg = json.loads(text)
    except ValueError as e:
        return None, f"not JSON: {e}"
    if not isinstance(msg, dict) or not isinstance(msg.get("cmd"), str):
        return None, "a frame must be a JSON object with \"cmd\" (a string)"
    rid = msg.get("id")
    if rid is not None and not (isinstance(rid, int) and not isinstance(rid, bool) or isinstance(rid, str) and len(rid) <= 64):
        return None, "\"id\" must be a number or a short string"
    return msg, None


def reply_of(req: dict, r: dict) -> dict | None:
    """The page's reply to a request (None for a keep-alive that went through)."""
    cmd = req.get("cmd")
    if cmd == "alive" and r.get("ok"):
        return None
    return {"type": "reply", "id": req.get("_id", req.get("id")), "cmd": cmd, "ok": bool(r.get("ok")),
            "error": r.get("error"), "reply": r}


async def _pumped(page: Page) -> None:
    with contextlib.suppress(Exception):  # the page went away: its receive loop ends too
        await page.pump()


class Guard:
    """ASGI wrapper: refuses a request whose Host is not the panel's (DNS rebinding), adds the
    security headers to every response."""

    def __init__(self, app, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        host = Headers(scope=scope).get("host")
        if not self.access.host_ok(host):
            if scope["type"] == "websocket":
                return await WebSocketClose(code=1008, reason="bad Host")(scope, receive, send)
            return await PlainTextResponse(f"pkrt panel: Host {host!r} is not one of this panel's names\n",
                                           status_code=403)(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(k.encode(), v.encode()) for k, v in HEADERS.items()]
            await send(message)

        return await self.app(scope, receive, with_headers)
