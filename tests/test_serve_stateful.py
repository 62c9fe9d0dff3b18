"""The served machine against the PLCopen model of docs/operation.md, by hypothesis's stateful
testing: random sequences of enable, home, jog, move, run, hold, resume, override, stop,
estop, reset, disable, stream, release, keep-alives, client disconnects and malformed lines,
sent through the real Unix socket (``MachineClient``) to the Delta on the simulated plant in
lockstep (``Served``: the loop thread, the socket server, the planning process).

After every step (``invariant``) and over the whole run log at the end:

- every reply comes within the client's timeout (the socket never hangs) and is one JSON line
  with the state the command left the machine in;
- a command the model's state table does not allow there is refused with a line naming that
  state; an accepted one leads where the table says (``AFTER``);
- every state the machine reports is reachable from the one before by the table's transitions
  or by the motion's own (a move ends, a hold comes to rest, a stream times out);
- no motion without enable: in ``disabled`` and ``error_stop`` the torque is off, the logged
  force and reference velocity are zero and the machine does not move;
- no limit crossed: every logged reference inside the soft limits, every position inside the
  actuator ranges, and no fault but the emergency stops the test sent;
- ``estop`` ends in ``error_stop`` within one cycle, torque off (its reply, and the log row of
  its cycle);
- the log records every command: one ``command`` event per request that is not a status or
  a keep-alive, in order (malformed ones included).

Bounded: ``EXAMPLES`` sequences of at most ``STEPS`` steps (about a minute), derandomized, no
example database. The figures (examples, steps, states and transitions visited) are printed
(``pytest -s``).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.machine.settings import ServeSettings, soft_limits

EXAMPLES, STEPS = 40, 40
TIMEOUT = 20.0  # s: a reply later than this is a hung socket
MACHINES = Path(__file__).resolve().parent.parent / "models" / "machines"
PROTECTION_LINE = re.compile(r"^(radius|segment|cone|cone_axis) = .*\n", re.MULTILINE)


def delta_without_passive_limits(d: Path) -> str:
    """The simulated Delta with its description's passive-joint cones and capsules left out
    (the tests of soft and velocity limits go where the rods' ball joints would stop them
    first); the same dynamics, so the shipped trees fit it."""
    (d / "delta.toml").write_text(PROTECTION_LINE.sub("", (MACHINES / "delta.toml").read_text()))
    cfg = (MACHINES / "delta-sim.toml").read_text()
    cfg = cfg.replace('model = "delta"', f'model = "{d / "delta.toml"}"', 1)
    for tree in ("delta.pkt", "delta-plant.pkt"):
        cfg = cfg.replace(f'"{tree}"', f'"{MACHINES / tree}"', 1)
    (d / "delta-sim.toml").write_text(cfg)
    return str(d / "delta-sim.toml")

# docs/operation.md, "States": state -> the commands it allows (status, alive, release, estop:
# every state), and where an accepted command leads at once (its reply's state)
ANY = {"status", "alive", "release", "estop"}
ALLOWS = {
    "disabled": ANY | {"enable", "override"},
    "standstill": ANY | {"disable", "home", "jog", "move", "run", "stream", "override"},
    "homing": ANY | {"stop"},
    "moving": ANY | {"hold", "override", "stop", "jog", "stream"},
    "holding": ANY | {"resume", "stop", "disable", "override"},
    "stopping": ANY | {"override"},
    "error_stop": ANY | {"reset"},
}
AFTER = {"enable": {"standstill"}, "disable": {"disabled"}, "estop": {"error_stop"}, "reset": {"disabled"},
         "home": {"standstill", "homing"}, "jog": {"moving", "standstill", "stopping"},
         "move": {"moving", "standstill"}, "run": {"moving", "standstill"}, "stream": {"moving", "standstill", "stopping"},
         "resume": {"moving"}, "stop": {"stopping", "standstill", "error_stop"}}
# what the machine does by itself between two commands: a motion ends or is held at rest, a
# stop ramps down, a jog's dead-man or a stream's timeout stops it, homing ends
BY_ITSELF = {"moving": {"standstill", "holding", "stopping"}, "stopping": {"standstill"},
             "homing": {"standstill", "error_stop"}, "holding": set(), "standstill": set(), "disabled": set(),
             "error_stop": set()}
GARBAGE = [b"not json\n", b"[1, 2, 3]\n", b"{\"cmd\": 7}\n", b"{\"cmd\": \"fly\"}\n", b"{}\n", b"\xff\xfe\n",
           b"{\"cmd\": \"move\", \"target\": \"here\"}\n", b"{\"cmd\": \"override\", \"value\": 1e400}\n",
           b"{\"cmd\": \"jog\", \"axis\": 9, \"velocity\": 0.1}\n", b"{\"cmd\": \"move\", \"target\": [[0.1], 0, 0]}\n",
           b"{\"cmd\": \"run\", \"file\": \"/nonexistent.csv\"}\n", b"{\"cmd\": \"enable\", \"id\": [1, {\"a\": 2}]}\n",
           b"{\"cmd\": \"move\", \"target\": [0.1, 0.1, " + b"9" * 500 + b"]}\n",
           b"{\"cmd\": \"move\", \"target\": [0.1, 0.1, " + b"9" * 5000 + b"]}\n",  # beyond int conversion
           b"[" * 30000 + b"]" * 30000 + b"\n", b"{\"cmd\": \"stream\", \"target\": [NaN, 0, 0]}\n",
           b"{\"cmd\": \"override\", \"value\": Infinity}\n", b"\x00" * 100 + b"\n"]
KNOWN = set().union(*ALLOWS.values())
FIGURES = {"examples": 0, "steps": 0, "commands": Counter(), "states": Counter(), "transitions": Counter(),
           "refused": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("stateful")
    # random targets over the actuator ranges: on the shipped Delta a third are beyond its rods'
    # ball-joint cones and refused, which leaves the states behind a move (holding, stopping)
    # seldom visited; the passive limits have tests of their own (test_passive*.py)
    srv = Served(delta_without_passive_limits(d), socket_path=str(d / "m.sock"), lockstep=True,
                 log_path=str(d / "m.pktlog"), settings=ServeSettings(deadman_s=2.0))
    srv.start()
    csv = d / "prog.csv"
    csv.write_text("t,theta1,theta2,theta3\n0,0.1,0.1,0.1\n0.4,0.2,0.05,0.1\n0.8,0.1,0.1,0.1\n")
    yield srv, str(csv), d
    srv.close()


class ServedModel(RuleBasedStateMachine):
    """One connection (reopened on ``disconnect``), the last state seen, and the requests sent
    (for the log check)."""

    srv: Served
    csv: str
    sent: list

    def __init__(self):
        super().__init__()
        self.client: MachineClient | None = None
        self.state = None
        self.estops = 0
        self.trace: list = []  # (request, ok, state, error) of this example, for a failure's message

    # -- plumbing -----------------------------------------------------------------------------------
    def request(self, obj: dict) -> dict:
        t0 = time.monotonic()
        r = self.client.request(obj)  # the client's socket timeout: TIMEOUT
        assert time.monotonic() - t0 < TIMEOUT, obj
        assert isinstance(r, dict) and isinstance(r.get("ok"), bool), r
        assert "state" in r, (obj, r)  # every reply says where the machine is
        if not r["ok"]:
            assert isinstance(r.get("error"), str) and "\n" not in r["error"] and len(r["error"]) < 1000, r
            FIGURES["refused"] += 1
        if obj.get("cmd") not in ("status", "alive"):
            type(self).sent.append(obj.get("cmd") if obj.get("cmd") in KNOWN else "?")
            self.trace.append((obj, r.get("ok"), r.get("state"), r.get("error")))
        FIGURES["commands"][obj.get("cmd") if isinstance(obj.get("cmd"), str) else "?"] += 1
        return r

    def command(self, cmd: str, **args) -> dict:
        before = self.observe()
        r = self.request({"cmd": cmd, **args})
        after = r["state"]
        if r["ok"]:
            if cmd in AFTER:
                assert after in AFTER[cmd], (cmd, before, r)
            if cmd == "estop":  # within the cycle that executed it, torque off
                assert after == "error_stop" and not self.status()["torque_on"], r
                self.estops += 1
        elif before == after and cmd not in ALLOWS[before] and "being planned" not in r["error"]:
            # refused by the state it was sent in (it did not change meanwhile): the line names it
            assert before in r["error"], (cmd, before, r["error"])
        if cmd in ALLOWS and r["ok"] and cmd not in ANY:
            # accepted: allowed where it was executed (the state before it, or one the machine
            # reached by itself meanwhile)
            assert cmd in ALLOWS[before] or any(cmd in ALLOWS[s] for s in BY_ITSELF[before]), (cmd, before, r)
        self.state = after
        return r

    def status(self) -> dict:
        r = self.request({"cmd": "status"})
        assert r["ok"], r
        return r["status"]

    def observe(self) -> str:
        st = self.status()["state"]
        if self.state is not None and st != self.state:
            assert st in BY_ITSELF[self.state], (self.state, st)
            FIGURES["transitions"][(self.state, st)] += 1
        self.state = st
        FIGURES["states"][st] += 1
        return st

    # -- rules ---------------------------------------------------------------------------------------
    @initialize()
    def connect(self):
        FIGURES["examples"] += 1
        self.client = MachineClient(self.srv.socket_path, timeout=TIMEOUT)
        self.state = None
        self.observe()

    @rule()
    def enable(self):
        self.command("enable")

    @rule()
    def disable(self):
        self.command("disable")

    @rule()
    def home(self):
        self.command("home")

    @rule(axis=st.integers(0, 2), v=st.floats(-0.5, 0.5))
    def jog(self, axis, v):
        self.command("jog", axis=axis, velocity=v)

    @rule(axis=st.integers(0, 2), step=st.floats(-0.2, 0.2))
    def jog_step(self, axis, step):
        self.command("jog", axis=axis, step=step)

    @rule(goal=st.lists(st.floats(-0.4, 1.1), min_size=3, max_size=3), speed=st.sampled_from([0.05, 0.25, 1.0]))
    def move(self, goal, speed):
        self.command("move", target=goal, speed=speed)

    @rule(dz=st.floats(-0.05, 0.05))
    def move_task(self, dz):
        self.command("move", space="task", target=[0.0, 0.0, -0.8 + dz], task_speed=0.2)

    @rule(demo=st.booleans())
    def run(self, demo):
        self.command("run", file="demo" if demo else self.csv)

    @rule(goal=st.lists(st.floats(-0.2, 0.9), min_size=3, max_size=3))
    def stream(self, goal):
        self.command("stream", target=goal)

    @rule()
    def hold(self):
        self.command("hold")

    @rule()
    def resume(self):
        self.command("resume")

    @rule(value=st.floats(-0.5, 1.5))
    def override(self, value):
        r = self.command("override", value=value)
        if not 0.0 <= value <= 1.2:
            assert not r["ok"], (value, r)
        elif r["state"] != "error_stop":  # allowed everywhere else
            assert r["ok"], (value, r)

    @rule()
    def stop(self):
        self.command("stop")

    @rule(now=st.integers(0, 3))
    def estop(self, now):
        """One time in four (an emergency stop ends everything: the others explore motion)."""
        if now == 0:
            self.command("estop")
        else:
            self.observe()

    @rule()
    def reset(self):
        self.command("reset")

    @rule(axis=st.integers(0, 2), goal=st.floats(0.0, 0.8), speed=st.sampled_from([0.02, 0.1, 0.5]),
          hold=st.booleans())
    def progress(self, axis, goal, speed, hold):
        """The step that takes the machine on from where it is (no precondition: hypothesis
        draws the same data whatever the machine's timing): back to standstill from a stop,
        a move from standstill, a feed hold or a resume during one."""
        st_ = self.observe()
        if st_ == "error_stop":
            self.command("reset")
        elif st_ == "disabled":
            self.command("enable")
        elif st_ == "standstill":
            target = [0.1, 0.1, 0.1]
            target[axis] = goal
            self.command("move", target=target, speed=speed)
        elif st_ == "moving":
            self.command("hold" if hold else "stop")
        elif st_ == "holding":
            self.command("resume" if hold else "disable")

    @rule()
    def release(self):
        self.command("release")

    @rule()
    def alive(self):
        self.command("alive")

    @rule(seconds=st.sampled_from([0.0, 0.05, 0.3]))
    def wait(self, seconds):
        time.sleep(seconds)
        self.observe()

    @rule()
    def disconnect(self):
        """The client goes away (its jog is released by the dead-man) and comes back."""
        self.client.close()
        self.client = MachineClient(self.srv.socket_path, timeout=TIMEOUT)
        self.observe()

    @rule(line=st.sampled_from(GARBAGE))
    def malformed(self, line):
        self.client.sock.sendall(line)
        raw = self.client.f.readline()
        assert raw.endswith(b"\n"), raw
        r = json.loads(raw)
        assert r["ok"] is False and "\n" not in r["error"] and len(r["error"]) < 1000, r
        assert "state" in r, r
        try:
            req = json.loads(line)
        except (ValueError, RecursionError):
            req = None
        name = req.get("cmd") if isinstance(req, dict) else None
        type(self).sent.append(name if isinstance(name, str) and name in KNOWN else "?")

    # -- invariants ---------------------------------------------------------------------------------
    @invariant()
    def torque_off_unless_enabled(self):
        if self.client is None:
            return
        st = self.status()
        FIGURES["steps"] += 1
        if st["state"] in ("disabled", "error_stop"):
            assert not st["torque_on"], st
        assert st["fault"] in (None, "emergency stop"), (st["fault"], self.trace[-12:])  # none but the test's estops

    def teardown(self):
        if self.client is not None:
            self.client.close()


def test_served_machine_follows_the_plcopen_model(served):
    srv, csv, d = served
    ServedModel.srv, ServedModel.csv, ServedModel.sent = srv, csv, []
    run_state_machine_as_test(ServedModel, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, derandomize=True, database=None, deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: one machine serves every example, its
        suppress_health_check=list(HealthCheck)))  # timing is the host's (a failure prints its steps)
    sent = list(ServedModel.sent)
    srv.close()
    log = read_log(str(d / "m.pktlog"))
    check_log(log, srv, sent)
    print(f"\nserved machine, stateful: {FIGURES['examples']} examples, {FIGURES['steps']} steps, "
          f"{sum(FIGURES['commands'].values())} requests, {FIGURES['refused']} refused; states seen "
          f"{dict(FIGURES['states'])}; transitions by itself {dict(FIGURES['transitions'])}; "
          f"log {log.n_cycles} cycles, states logged {FIGURES.get('logged_states')}")
    # every state was visited (the log's state channel: a stop in lockstep ramps down in a few
    # cycles, often between two statuses), and the client saw all but the short-lived one
    states = {"disabled", "standstill", "moving", "holding", "stopping", "error_stop"}
    assert set(FIGURES["logged_states"]) >= states and set(FIGURES["states"]) >= states - {"stopping"}


def check_log(log, srv, sent: list) -> None:
    """The run log over every example: motion only when enabled, limits, estops, commands."""
    codes = {v: k for k, v in log.header["state_codes"].items()}
    state = np.array([codes[int(c)] for c in np.ravel(log.get("state"))])
    FIGURES["logged_states"] = dict(Counter(state.tolist()))
    off = np.isin(state, ["disabled", "error_stop"])
    assert np.all(log.get("tau")[off] == 0.0)  # no torque without enable
    assert np.all(log.get("ref_vel")[off] == 0.0)
    ref, pos = log.get("ref_pos"), log.get("pos")
    runs = np.flatnonzero(np.diff(off.astype(int)) != 0) + 1
    for a, b in zip(np.r_[0, runs], np.r_[runs, len(off)]):
        if off[a]:  # a stretch without torque: the machine does not move
            assert np.abs(pos[a:b] - pos[a]).max() == 0.0, (a, b)
    lo, hi = soft_limits(srv.config, srv.settings)
    for a, b in zip(np.r_[0, runs], np.r_[runs, len(off)]):
        if not off[a]:  # with torque: the reference keeps inside the soft limits, widened to where the
            # machine stood when enabled (it may stand beyond them by its tracking error: it comes back,
            # never goes further; test_motion_from_beyond_the_soft_limits_comes_back_without_a_fault)
            lo_a, hi_a = np.minimum(lo, ref[a]), np.maximum(hi, ref[a])
            assert np.all(ref[a:b] >= lo_a - 1e-12) and np.all(ref[a:b] <= hi_a + 1e-12), (a, b)  # no limit crossed
    lim = srv.config.limits.position
    assert np.all(log.get("pos") >= lim[:, 0]) and np.all(log.get("pos") <= lim[:, 1])
    faults = [e for e in log.events if e["kind"] == "fault"]
    assert all(e["message"] == "emergency stop" for e in faults), faults
    # each estop: error_stop from the cycle that executed it, torque off
    rows = {int(c): i for i, c in enumerate(log.cycles)}
    for e in log.events:
        if e["kind"] == "command" and e["message"].startswith('{"cmd": "estop"'):
            i = rows.get(int(e["cycle"]))
            if i is not None:
                assert state[i] == "error_stop" and np.all(log.get("tau")[i] == 0.0), e
    # every request but status and keep-alives is a command event, in order (the loop's own
    # internal ones aside: a plan handed back, a dead-man's release)
    logged = []
    for e in log.events:
        if e["kind"] != "command":
            continue
        m = e["message"]
        name = m.split('"cmd": "', 1)[1].split('"', 1)[0] if m.startswith('{"cmd": "') else "?"
        if name == "planned" or '"why": "dead-man' in m:
            continue
        logged.append(name if name in KNOWN | {"plan"} else "?")
    logged = ["run" if x == "plan" else x for x in logged]
    assert logged == sent, (len(logged), len(sent), [(i, a, b) for i, (a, b) in enumerate(zip(logged, sent))
                                                     if a != b][:5])


def test_motion_from_beyond_the_soft_limits_comes_back_without_a_fault(tmp_path):
    """A jog to the soft limit stops its reference there, and the machine overshoots it by its
    tracking error (0.1 mrad on the Delta); an estop then makes that measured position the
    reference, and so does the enable after it. A stream, a jog and a move from there go back
    inside, never further out, with no fault (the stream faulted at its first sample, the move
    was refused: found by the stateful test)."""
    srv = Served(delta_without_passive_limits(tmp_path), socket_path=str(tmp_path / "m.sock"), lockstep=True,
                 log_path=str(tmp_path / "m.pktlog"), plan_process=False)
    lo, hi = soft_limits(srv.config, srv.settings)
    armed = []

    def estop_beyond(m):  # in the loop's thread: the cycle after the machine passed the soft limit
        if armed and m.pos_now[1] > hi[1]:
            armed.clear()
            m.submit({"cmd": "estop"})
    srv.start(on_cycle=estop_beyond)
    try:
        with MachineClient(srv.socket_path, timeout=TIMEOUT) as c:
            c.enable()
            c.home()
            for how in ("stream", "jog", "move"):
                armed.append(1)
                c.request({"cmd": "jog", "axis": 1, "velocity": 2.0})
                _wait(c, "error_stop")
                c.reset()
                c.enable()
                st = c.status()
                assert st["reference"][1] > hi[1], st  # held where it stands: beyond the soft limit
                start = st["reference"][1]
                r = {"stream": lambda: c.request({"cmd": "stream", "target": [0.1, 0.5, 0.1]}),
                     "jog": lambda: c.request({"cmd": "jog", "axis": 1, "velocity": -0.5}),
                     "move": lambda: c.request({"cmd": "move", "target": [0.1, 0.5, 0.1]})}[how]()
                assert r["ok"], (how, r)
                top = start
                for _ in range(400):
                    st = c.status()
                    top = max(top, st["reference"][1])
                    assert st["fault"] is None, (how, st["fault"])
                    if st["reference"][1] < hi[1] - 0.05:
                        break
                    time.sleep(0.005)
                assert st["reference"][1] < hi[1] - 0.05 and top == start, (how, st["reference"], top, start)
                c.request({"cmd": "release"})
                c.request({"cmd": "stop"})
                c.wait_state("standstill")
    finally:
        srv.close()


def _wait(c: MachineClient, state: str, timeout: float = TIMEOUT) -> dict:
    end = time.monotonic() + timeout
    while True:
        st = c.status()
        if st["state"] == state or time.monotonic() > end:
            return st
        time.sleep(0.002)


def test_a_move_at_full_speed_does_not_trip_the_velocity_limit(tmp_path):
    """``move --speed 1`` (the whole limits) over most of a range: its reference peaked at the
    velocity limit and the machine's tracking took it 0.02 % over: a velocity-limit fault
    (found by the stateful test). References keep 2 % below the limits (``limit_margin``)."""
    srv = Served(delta_without_passive_limits(tmp_path), socket_path=str(tmp_path / "m.sock"), lockstep=True,
                 log_path=str(tmp_path / "m.pktlog"), plan_process=False)
    srv.start()
    try:
        with MachineClient(srv.socket_path, timeout=TIMEOUT) as c:
            c.enable()
            for target in ([0.0, 0.98, 0.0], [0.0, -0.28, 0.0], [0.9, 0.9, 0.9]):
                c.move(target, speed=1.0)
                st = _wait(c, "standstill")
                assert st["state"] == "standstill" and st["fault"] is None, st
    finally:
        srv.close()
    log = read_log(str(tmp_path / "m.pktlog"))
    vmax = srv.config.limits.velocity
    assert np.abs(log.get("ref_vel")).max() <= 0.98 * vmax.max() + 1e-9
    assert 0.9 * vmax.max() < np.abs(log.get("ref_vel")).max()  # the move did run near the limit
