"""Contacts wired to a run: the simulated plant's external forces (``--inject contact@...`` and
``clamp@...``) and the tool force behind a detected contact, both through the tool's Jacobian
computed from the model here (``pkrt.models.kinematics.tooljacobian``): the plant (drivers) and
the loop (runtime) get it as a callable, never the model. Units: N, N/m, s."""

from __future__ import annotations

import math

from pkrt.rt.core.errors import UserError

CONTACT_KINDS = ("contact", "clamp")
SYNTAX = "contact@T=FX,FY,FZ[,DURATION] or clamp@T=STIFFNESS"


def parse_contact(spec: str) -> dict:
    """``contact@T=FX,FY,FZ[,DURATION]`` (a force step of (FX, FY, FZ) N at the tool from T s for
    DURATION s, default to the end) or ``clamp@T=STIFFNESS`` (a wall at the tool's position at T s,
    STIFFNESS N/m); one line ``--inject: ...`` for anything else."""
    kind, _, rest = spec.partition("@")
    at, _, val = rest.partition("=")
    try:
        at_s = float(at)
        nums = [float(x) for x in val.split(",")] if val else []
    except ValueError:
        raise UserError(f"--inject: expected {SYNTAX}, got '{spec}'") from None
    if not all(math.isfinite(x) for x in [at_s, *nums]) or at_s < 0:
        raise UserError(f"--inject: time and values must be finite numbers (time >= 0), got '{spec}'")
    if kind == "contact":
        if len(nums) not in (3, 4) or (len(nums) == 4 and nums[3] <= 0):
            raise UserError(f"--inject: expected contact@T=FX,FY,FZ[,DURATION] (N, s; DURATION > 0), got '{spec}'")
        return {"kind": "force", "at": at_s, "force": nums[:3], "duration": nums[3] if len(nums) == 4 else math.inf}
    if kind == "clamp":
        if len(nums) != 1 or nums[0] <= 0:
            raise UserError(f"--inject: expected clamp@T=STIFFNESS (N/m, > 0), got '{spec}'")
        return {"kind": "wall", "at": at_s, "stiffness": nums[0]}
    raise UserError(f"--inject: unknown contact '{kind}' ({SYNTAX})")


def tool_jacobian(mech):
    """``theta -> (x, J)`` of the mechanism's tool; one line when it has no ``[tool]``."""
    from pkrt.models.kinematics.tooljacobian import ToolJacobian

    return ToolJacobian(mech)


def arm_contact(drives, spec: str, plant_mech) -> dict:
    """Arm the contact ``spec`` on the simulated plant ``drives`` with the tool Jacobian of the
    plant's own model ``plant_mech`` (its truth); returns the parsed contact."""
    from pkrt.drivers.contact import Contact

    c = parse_contact(spec)
    if not hasattr(drives, "inject_contact"):
        raise UserError("--inject contact and clamp work with the simulated plant only")
    tool = tool_jacobian(plant_mech)
    drives.inject_contact(Contact(c["kind"], c["at"], drives.n_axes, tool, force=c.get("force", (0.0, 0.0, 0.0)),
                                  duration=c.get("duration", math.inf), stiffness=c.get("stiffness", 0.0)))
    return c


def contact_data(spec: str, mech, plan) -> dict:
    """``spec`` as data for a drive emulator's plant (``pkrt.drivers.contact.Contact.data``): its
    tool linearised about the pose the planned reference ``plan`` has at the contact's time (the
    emulator's process loads no model; a contact lasts a fraction of a second and the machine
    stops: the pose changes little)."""
    from pkrt.drivers.contact import Contact, LinearTool

    c = parse_contact(spec)
    k = min(max(int(round(c["at"] * plan.rate_hz)), 0), plan.n - 1)
    theta = plan.pos[k]
    x, J = tool_jacobian(mech)(theta)
    return Contact(c["kind"], c["at"], len(theta), LinearTool(x, J, theta), force=c.get("force", (0.0, 0.0, 0.0)),
                   duration=c.get("duration", math.inf), stiffness=c.get("stiffness", 0.0)).data()


def tool_force_of(mech):
    """``(theta, tau) -> dict``: the tool force behind actuator forces tau (a contact's residual),
    for the event of a detection; None for a mechanism without a tool."""
    if mech.description.tool is None:
        return None
    return tool_jacobian(mech).tool_force


__all__ = ["CONTACT_KINDS", "parse_contact", "arm_contact", "contact_data", "tool_force_of", "tool_jacobian"]
