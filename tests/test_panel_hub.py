"""The panel's push to one page (``pkrt.rt.panel.hub.Page``), on an asyncio loop with a page
that records what it is sent: the snapshot, then changed fields only, at most 20 updates a
second for views offered every 5 ms (the newest one sent after each pause), a change of the
state, fault or link not held back to the next update; a page that is slow to take its frames skips views, never queues them; non-finite
values sent as null."""

from __future__ import annotations

import asyncio
import json
import time

from pkrt.rt.panel.hub import UPDATE_S, URGENT_GAP, Page, dumps


def view(k: int, state: str = "moving") -> dict:
    return {"state": state, "joint": {"position": [k * 1e-3, 0.0]}, "info": {"machine": "m"}}


async def offer_for(page: Page, seconds: float, state_at: float | None = None) -> float | None:
    """Offer a new view every 5 ms for ``seconds``; the state changes at ``state_at`` s (the
    time it was offered, on time.monotonic, returned)."""
    t0, k, changed = time.monotonic(), 0, None
    while (t := time.monotonic() - t0) < seconds:
        state = "moving"
        if state_at is not None and t >= state_at:
            state = "error_stop"
            changed = changed or time.monotonic()
        page.offer(view(k, state))
        k += 1
        await asyncio.sleep(0.005)
    return changed


def run(seconds: float, state_at: float | None = None, delay: float = 0.0):
    sent: list[tuple[float, dict]] = []

    async def send(text: str) -> None:
        sent.append((time.monotonic(), json.loads(text)))
        if delay:
            await asyncio.sleep(delay)

    async def main():
        page = Page(send)
        pump = asyncio.create_task(page.pump())
        changed = await offer_for(page, seconds, state_at)
        await asyncio.sleep(0.1)
        pump.cancel()
        return page, changed

    page, changed = asyncio.run(main())
    return sent, page, changed


def test_snapshot_then_changes_paced_to_20_per_second():
    sent, page, _ = run(1.0)
    assert sent[0][1]["type"] == "snapshot" and sent[0][1]["view"]["info"] == {"machine": "m"}
    updates = [m for _, m in sent[1:]]
    assert all(m["type"] == "update" and set(m["changes"]) == {"joint"} for m in updates)  # only what changed
    assert 5 <= len(updates) <= 21, len(updates)
    gaps = [b - a for (a, _), (b, _) in zip(sent[1:], sent[2:])]
    assert min(gaps) >= 0.049
    assert page.skipped > 100  # the views offered meanwhile were replaced, not queued


def test_a_state_change_is_not_held_back():
    page = Page(None)
    page.sent = page.latest = view(0)
    assert page.gap() == UPDATE_S
    page.latest = view(1)
    assert page.gap() == UPDATE_S  # a new position waits for the next update
    for k, v in (("state", "error_stop"), ("fault", "emergency stop"), ("link", {"up": False})):
        page.latest = {**view(1), k: v}
        assert page.gap() == URGENT_GAP, k
    sent, _, _ = run(0.6, state_at=0.3)
    states = [m["changes"]["state"] for _, m in sent if m["type"] == "update" and "state" in m["changes"]]
    assert states == ["error_stop"]


def test_a_slow_page_skips_views():
    sent, page, _ = run(1.0, delay=0.3)  # each frame takes 0.3 s to go out
    assert len(sent) <= 5 and page.skipped > 150
    assert sent[-1][1]["changes"]["joint"]["position"][0] > 0.15  # the newest view, not the oldest


def test_non_finite_values_are_null():
    assert json.loads(dumps({"a": [1.0, float("nan")], "b": {"c": float("inf")}})) == {"a": [1.0, None], "b": {"c": None}}
