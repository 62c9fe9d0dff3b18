"""The served machine's states (PLCopen single-axis states, for the machine as a whole) and
which command each state allows. A command its state does not allow is refused with the
reason, never queued."""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    DISABLED = "disabled"        # torque off; the start state, and where reset leads
    STANDSTILL = "standstill"    # enabled, holding position
    HOMING = "homing"            # the drives search their reference
    MOVING = "moving"            # a motion source runs: jog, move, program or stream
    HOLDING = "holding"          # a move or program paused by feed hold (at rest on its path)
    STOPPING = "stopping"        # a commanded stop ramps down; then standstill
    ERROR_STOP = "error_stop"    # a fault or an emergency stop: torque off until reset


S = State
ENABLED = frozenset({S.STANDSTILL, S.HOMING, S.MOVING, S.HOLDING, S.STOPPING})
ALL = frozenset(State)

# command -> states it is allowed in
ALLOWED: dict[str, frozenset[State]] = {
    "status": ALL,
    "alive": ALL,
    "info": ALL,                                       # the machine's fixed description
    "events": ALL,                                     # the recent events (journal)
    "ack": ALL,                                        # acknowledge the alarms
    "enable": frozenset({S.DISABLED}),
    "disable": frozenset({S.STANDSTILL, S.HOLDING}),
    "home": frozenset({S.STANDSTILL}),
    "jog": frozenset({S.STANDSTILL, S.MOVING}),       # MOVING: only to change a running jog
    "release": ALL,                                    # a jog's end (never refused: a dead-man must work)
    "move": frozenset({S.STANDSTILL}),
    "run": frozenset({S.STANDSTILL}),
    "stream": frozenset({S.STANDSTILL, S.MOVING}),    # MOVING: only a running stream's next target
    "hold": frozenset({S.MOVING}),                     # a move or program
    "resume": frozenset({S.HOLDING}),
    "override": ENABLED | {S.DISABLED},
    "stop": frozenset({S.MOVING, S.HOLDING, S.HOMING}),
    "estop": ALL,
    "reset": frozenset({S.ERROR_STOP}),
}

# each names the state as ``status`` reports it
WHY_NOT: dict[State, str] = {
    S.DISABLED: "the machine is disabled (enable it first)",
    S.STANDSTILL: "the machine is at standstill",
    S.HOMING: "the machine is homing (stop it or wait)",
    S.MOVING: "the machine is moving (stop it first)",
    S.HOLDING: "the machine is holding, in feed hold (resume or stop first)",
    S.STOPPING: "the machine is stopping",
    S.ERROR_STOP: "the machine is in error stop, error_stop (reset first)",
}


STATE_CODES = {s: i for i, s in enumerate(State)}  # the ``state`` channel of logs and telemetry
# the server's internal commands -> the command whose allowed states they have
INTERNAL = {"plan": "run", "planned": "status"}
PLANNING_REFUSES = ("jog", "move", "run", "plan", "stream", "home")  # while a program is planned


def refusal(cmd: str, state: State) -> str | None:
    """Why ``cmd`` is refused in ``state`` (None: allowed by the state)."""
    allowed = ALLOWED.get(cmd)
    if allowed is None:
        return f"unknown command '{cmd}' (known: {', '.join(sorted(ALLOWED))})"
    if state in allowed:
        return None
    return f"{cmd} refused: {WHY_NOT[state]}"
