"""The machines' demos, planned from their models once per session (the planner takes seconds
per machine, and the HIL and runtime tests run the same demo dozens of times).

``demo_reference(config)`` has the signature of ``pkrt.rt.app.reference.plan_reference`` for a
demo (what ``run_can_hil``, ``run_serial_hil`` and the runtime tests pass as ``reference``): the
plan is keyed by what it is planned from (the model file, the ``[demo]`` table, the rate), and
its arrays are read-only, so a run that wrote into its reference would fail instead of changing
the next test's."""

from __future__ import annotations

from pkrt.rt.app.reference import plan_reference
from pkrt.rt.core.plan import Planned

_PLANS: dict[tuple, Planned] = {}


def demo_reference(config, mech=None) -> Planned:
    """The demo of ``config`` at its rate (``mech``: its model, when the caller has it loaded)."""
    key = (str(config.model_path), repr(config.demo), float(config.rate_hz))
    if key not in _PLANS:
        plan = plan_reference(config, mech=mech)
        for a in (plan.pos, plan.vel, plan.acc):
            a.flags.writeable = False
        _PLANS[key] = plan
    return _PLANS[key]
