"""CLI verb ``pkrt protect tune LOG...``: contact detection's thresholds from logs of normal runs
(``pkrt.rt.app.protecttune``)."""

from __future__ import annotations

import argparse

from pkrt.rt.cli.argtypes import positive_number
from pkrt.rt.cli.printing import emit


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG", help="run logs of normal motion with the residual "
                                                          "(pkrt run or pkrt serve with [protect] enabled = true)")
    p.add_argument("--false-alarm-rate", type=positive_number, default=0.01,
                   help="false alarms per hour of such motion (default: %(default)s)")
    p.add_argument("--machine", help="with -o: write this machine configuration with the [protect] table "
                                     "(a copy, paths made absolute) instead of the table alone")
    p.add_argument("-o", "--output", help="TOML file: the [protect] table, or with --machine a machine configuration")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_tune(args) -> int:
    from pkrt.rt.app.protecttune import tune, write
    from pkrt.rt.core.errors import UserError
    from pkrt.rt.core.outputs import check_outputs

    machine = None
    if args.machine is not None:
        if args.output is None:
            raise UserError("--machine needs -o (the machine configuration to write)")
        from pkrt.rt.runtime.machine.config import load_machine

        machine = load_machine(args.machine)
    inputs = {f"log {p}": p for p in args.logs}
    if machine is not None:
        inputs["--machine"] = machine.path
    check_outputs({"-o": args.output}, inputs)
    r = tune(list(args.logs), args.false_alarm_rate)
    if machine is not None and len(r["axes"]) != machine.limits.position.shape[0]:
        raise UserError(f"--machine {machine.path}: {machine.limits.position.shape[0]} actuators, the logs have "
                        f"{len(r['axes'])}")
    if args.output:
        write(r, args.output, machine)
        r["output"] = args.output
    emit(r, args.json, _text(r))
    return 0


def _text(r: dict) -> str:
    u = r["unit"]
    f = lambda v: ", ".join(f"{x:.4g}" for x in v)  # noqa: E731
    lines = [f"{r['normal_s']:.1f} s of normal motion in {len(r['logs'])} log(s) ({r['blocks']} blocks of "
             f"{r['block_s']:g} s), observer gain {r['gain']:g} 1/s; axes {', '.join(r['axes'])}",
             f"  residual {u}: RMS {f(r['rms'])}; p99.9 {f(r['p999'])}; max {f(r['max_seen'])}",
             f"  thresholds {u} for {r['false_alarm_rate_per_hour']:g} false alarms per hour: {f(r['thresholds'])}",
             f"  a force step detected within 10 ms from {f(r['detectable_in_10ms'])} {u} on its actuator"]
    lines += [f"  {x['log']}: cut at {x['cut_at']} (not normal motion from there)" for x in r["logs"] if x["cut_at"]]
    if r.get("output"):
        lines.append(f"  wrote {r['output']}")
    return "\n".join(lines)


VERBS = {"protect tune": (add_tune_arguments, run_tune)}
