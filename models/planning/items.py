"""A program's items (motions, dwells, events) planned one after another into one reference at
the loop rate, with each sample's program line, and the figures of the result."""

from __future__ import annotations

import time

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import MAX_SAMPLES, Planned

from .geompath import Dwell, Event
from .topp import PathPlanner


def plan_items(planner: PathPlanner, items: list, description: dict) -> tuple[Planned, dict]:
    """Motions, dwells and events (``geompath.Dwell``, ``geompath.Event``) in order, each
    motion from rest to rest, joined into one reference at the loop rate (with each sample's
    program line and each event's sample), and a report: duration, peaks, where limits bind,
    the events."""
    t0 = time.perf_counter()
    rate = planner.rate_hz
    pos, vel, acc, tau, line, speed, feed = [], [], [], [], [], [], []
    pending = 0
    feed_bound: set[int] = set()
    grid_points, stretch = 0, 1.0
    events = []

    def hold(seconds, at, ln):
        k = int(round(seconds * rate))
        if sum(len(p) for p in pos) + k > MAX_SAMPLES:
            raise UserError(f"{f'line {ln}: ' if ln else ''}a dwell of {seconds:g} s makes the program longer than "
                            f"{MAX_SAMPLES} samples at {rate:g} Hz")
        z = np.zeros((k, len(at)))
        pos.append(np.repeat(at[None], k, 0)), vel.append(z), acc.append(z), line.append(np.full(k, ln or 0))
        speed.append(np.zeros(k)), feed.append(np.full(k, np.inf))
        H, D, p = planner.dyn(at)
        tau.append(np.repeat((-p)[None], k, 0))

    for it in items:
        if isinstance(it, Event):
            done = sum(len(p) for p in pos)
            at = done - 1 if done else int(round(pending * rate))
            events.append({"sample": at, "kind": it.kind, "line": it.line, "hold": it.hold, **it.values})
            continue
        if isinstance(it, Dwell):
            if pos:
                hold(it.seconds, pos[-1][-1], it.line)
            else:
                pending += it.seconds
            continue
        plan, rep = planner.plan_motion(it)
        grid_points += rep["grid_points"]
        stretch = max(stretch, rep["stretch"])
        if pos:
            if np.abs(pos[-1][-1] - plan.pos[0]).max() > 1e-9:
                raise UserError("consecutive motions do not join (the inverse kinematics changed branch?)")
            cut = 1
            if planner.held_acc:  # the joint sample's period is the next motion's first
                acc[-1], tau[-1] = acc[-1].copy(), tau[-1].copy()
                acc[-1][-1], tau[-1][-1] = plan.acc[0], rep["tau"][0]
        else:
            cut = 0
            if pending:
                hold(pending, plan.pos[0], None)
        if sum(len(p) for p in pos) + plan.n > MAX_SAMPLES:
            raise UserError(f"the program is longer than {MAX_SAMPLES} samples at {rate:g} Hz")
        pos.append(plan.pos[cut:]), vel.append(plan.vel[cut:]), acc.append(plan.acc[cut:])
        tau.append(rep["tau"][cut:]), line.append(rep["line"][cut:]), speed.append(rep["speed"][cut:])
        feed.append(rep["feed"][cut:])
        feed_bound |= set(rep["feed_bound_lines"])
    if not pos:
        raise UserError("nothing to plan (no motion)")
    tau_all, line_all, speed_all, feed_all = (np.concatenate(x) for x in (tau, line, speed, feed))
    out = Planned(rate, np.vstack(pos), np.vstack(vel), np.vstack(acc), dict(description),
                  line_all.astype(np.int32), events)
    if planner.passive is not None:  # passive joints and capsules at the loop rate, before anything moves
        planner.passive.path(out.pos, rate, "trajectory refused: ", line_all)
    report = {**summary(planner, out, tau_all, line_all, speed_all, feed_all, feed_bound, time.perf_counter() - t0,
                        grid_points), "stretch": stretch}
    report["events"] = [{**e, "t_s": e["sample"] / rate} for e in events]
    return out, report


def summary(planner: PathPlanner, plan: Planned, tau, line, speed, feed, feed_bound, seconds, grid_points) -> dict:
    """Figures of a planned reference: duration, peaks per actuator, the share of samples where
    each limit binds (>= 99 % of its planning value) and the program lines where it does; per
    program line with a feed: the feed, the peak tool speed and whether the planner found the
    feed reachable there."""
    lim = planner.limits
    vl, al, fl = lim.planning
    names = planner.mech.actuator_names
    binds = {}
    for what, val, cap in (("velocity", plan.vel, vl), ("acceleration", plan.acc, al), ("force", tau, fl)):
        on = np.abs(val) >= 0.99 * cap
        binds[what] = {n: {"share": float(on[:, j].mean()),
                           "lines": sorted({int(x) for x in line[on[:, j]] if x})} for j, n in enumerate(names)}
    fin = np.isfinite(feed)
    on = fin & (speed >= 0.99 * np.where(fin, feed, 0.0))
    binds["feed"] = {"share": float(on.mean()), "lines": sorted({int(x) for x in line[on] if x})}
    feeds = []
    for ln in sorted({int(x) for x in line[fin] if x}):
        sel = (line == ln) & fin
        feeds.append({"line": ln, "feed_m_s": float(feed[sel].max()), "peak_speed_m_s": float(speed[sel].max()),
                      "feed_reachable": ln in feed_bound})
    return {"duration_s": plan.duration, "samples": plan.n, "rate_hz": plan.rate_hz, "margin": lim.margin,
            "dynamics": getattr(planner.dyn, "name", "model"), "grid_points": grid_points,
            "planning_s": seconds,
            "peak_velocity": dict(zip(names, np.abs(plan.vel).max(axis=0).tolist())),
            "peak_acceleration": dict(zip(names, np.abs(plan.acc).max(axis=0).tolist())),
            "peak_force": dict(zip(names, np.abs(tau).max(axis=0).tolist())),
            "limits": {"velocity": lim.velocity.tolist(), "acceleration": lim.acceleration.tolist(),
                       "force": lim.force.tolist()},
            "binding": binds, "feeds": feeds,
            "_speed": speed, "_feed": feed, "_tau": tau}  # for the plot (not printed)
