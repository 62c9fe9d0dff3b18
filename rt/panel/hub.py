"""Pushing the view to the pages: each page has a slot holding the latest view (a bounded
queue of one: a slow page skips views, never stores them, and never slows the poller or the
other pages) and its replies; its pump sends the whole view once, then only the changed fields,
at most one update per ``min_interval`` (coalesced: the newest view after the pause), except
that a change of the machine's state, fault or link goes at once (``URGENT``; at least
``URGENT_GAP`` after the last update): a page sees a state change within one poll of the
machine, never a pacing period later."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import deque

from pkrt.rt.panel.view import changes

UPDATE_S = 0.05  # s between two updates of one page, at least (20 per second at most) ...
URGENT = ("state", "fault", "link")  # ... unless one of these changed: then
URGENT_GAP = 0.01  # s after the last update
REPLIES = 256  # replies waiting for one page, at most (a page that reads none loses the oldest)


def dumps(obj) -> str:
    """Compact JSON; a value that is not finite becomes null (the page's JSON has no NaN)."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), separators=(",", ":"))


def _finite(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


class Page:
    """One connected page: ``send`` (a coroutine taking a text frame), its view slot, replies."""

    def __init__(self, send, min_interval: float = UPDATE_S):
        self.send, self.min_interval = send, min_interval
        self.latest: dict | None = None
        self.sent: dict | None = None  # the view as the page has it
        self.replies: deque = deque(maxlen=REPLIES)
        self.wake = asyncio.Event()
        self.last = -math.inf
        self.updates = self.skipped = 0

    def offer(self, view: dict) -> None:
        if self.latest is not None and self.latest is not self.sent:
            self.skipped += 1  # replaced before it was sent
        self.latest = view
        self.wake.set()

    def reply(self, msg: dict) -> None:
        self.replies.append(msg)
        self.wake.set()

    def gap(self) -> float:
        """The shortest time from the last update to the next: ``URGENT_GAP`` when the latest
        view changes the state, fault or link, else ``min_interval``."""
        urgent = self.sent is not None and self.latest is not None and \
            any(self.latest.get(k) != self.sent.get(k) for k in URGENT)
        return URGENT_GAP if urgent else self.min_interval

    async def pump(self) -> None:
        """Send replies as they come and views at most every ``min_interval`` (until cancelled)."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.replies:
                await self.send(dumps(self.replies.popleft()))
            if self.latest is None or self.latest is self.sent:
                continue
            pause = self.last + self.gap() - time.monotonic()
            if pause > 0:  # a newer view (an urgent one) or a reply ends the pause early
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), pause)
                self.wake.set()  # the newest view (and any reply) on the next turn
                continue
            view = self.latest
            if self.sent is None:
                msg = {"type": "snapshot", "view": view}
            else:
                diff = changes(self.sent, view)
                msg = {"type": "update", "changes": diff} if diff else None
            self.sent = view
            if msg is not None:
                self.last = time.monotonic()
                self.updates += 1
                await self.send(dumps(msg))


class Hub:
    """The pages of one panel; ``publish`` (from any thread) offers a view to every page."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.pages: set[Page] = set()
        self.view: dict | None = None

    def publish(self, view: dict) -> None:
        try:
            self.loop.call_soon_threadsafe(self._offer, view)
        except RuntimeError:  # the event loop has closed (the panel is stopping)
            pass

    def _offer(self, view: dict) -> None:
        self.view = view
        for p in self.pages:
            p.offer(view)

    def add(self, page: Page) -> None:
        self.pages.add(page)
        if self.view is not None:
            page.offer(self.view)

    def remove(self, page: Page) -> None:
        self.pages.discard(page)
