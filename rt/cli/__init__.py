"""The ``pkrt`` command line.

The CLI layer: one module per verb group in this package (``model``, ``tree``, ``run``, ``plan``,
``hil``, ``log``, ``replay``, ``identify``, ``calibrate``, ``serve``, ``panel``, ``bench``); each lists its verbs in ``VERBS`` (verb ->
(add_arguments(parser), run(args) -> int)). The command line is an argparse tree: a subparser
per verb, and per group of two-word verbs (``pkrt tree --help`` lists the group's verbs); only
the module of the verb being run is imported and fills its subparser. Verb modules parse, call
the library (the application layer ``pkrt.rt.app`` for what wires a machine together) and print. Errors are classed by cause
(``pkrt.rt.core.errors``) and mapped to exit codes here only (``EXIT_CODES``): 0 success, 1 a fault
at run time or a failed check, 2 bad input or usage, a model that cannot be computed there, an
output not written (``pkrt: error: ...`` on stderr; ``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import traceback


from pkrt.rt.core.errors import CheckFailed, Fault, ModelFailure, OutputError, Stopped, UserError
from pkrt.rt.core.inputs import numeric_error, numeric_warnings_raised, shorten_tokens

# verb -> (module, one-line help). Two-word verbs are written "model check"; their first word is a
# group with its own help (GROUPS).
COMMANDS: dict[str, tuple[str, str]] = {
    "model check": ("pkrt.rt.cli.model", "check a machine description: coordinates, constraints, mobility, singularity, "
                                         "passive-joint margins"),
    "model eval": ("pkrt.rt.cli.model", "evaluate H, D, p_ext (and h, tau) of a model or a tree"),
    "build": ("pkrt.rt.cli.tree", "build a reduced-dynamics tree from a model"),
    "tree info": ("pkrt.rt.cli.tree", "show a tree file's header"),
    "tree verify": ("pkrt.rt.cli.tree", "compare a tree with the exact model"),
    "tree plot": ("pkrt.rt.cli.tree", "plot a tree against the exact model (diagonal, error maps) to PNG"),
    "run": ("pkrt.rt.cli.run", "run a machine under control (default: the Orthoglide demo on the simulated plant)"),
    "plan": ("pkrt.rt.cli.plan", "time a G-code program, a CSV path or the Adept cycle in minimum time under the limits"),
    "hil": ("pkrt.rt.cli.hil", "hardware-in-the-loop run through a real driver, bus and drive emulator"),
    "replay": ("pkrt.rt.cli.replay", "replay a logged run and compare"),
    "log info": ("pkrt.rt.cli.log", "summary of a run log"),
    "log export": ("pkrt.rt.cli.log", "export a run log as CSV, MCAP or a ROS 2 bag"),
    "log plot": ("pkrt.rt.cli.log", "plot a run log to PNG"),
    "identify plan": ("pkrt.rt.cli.identify", "plan an exciting trajectory for identification (CSV for pkrt run --traj)"),
    "identify": ("pkrt.rt.cli.identify", "identify masses and friction from run logs (an identified model file)"),
    "calibrate plan": ("pkrt.rt.cli.calibrate", "plan measurement poses for geometric calibration (CSV for pkrt run --traj)"),
    "calibrate": ("pkrt.rt.cli.calibrate", "calibrate the geometry from an instrument's readings of the tool (a calibrated model file)"),
    "protect tune": ("pkrt.rt.cli.protect", "contact detection's thresholds from logs of normal runs"),
    "serve": ("pkrt.rt.cli.serve", "serve a machine: a long-running loop with states, commanded over a socket"),
    "ctl": ("pkrt.rt.cli.serve", "command a served machine: status, enable, home, jog, move, run, hold, resume, ..., "
                                  "check move/travel"),
    "panel": ("pkrt.rt.cli.panel", "an operator's web page for a served machine (state, jog, programs, emergency stop)"),
    "bench": ("pkrt.rt.cli.bench", "benchmarks: exact reduction, tree evaluation, loop timing, drivers"),
}

GROUPS: dict[str, str] = {
    "model": "machine descriptions: check, evaluate",
    "tree": "reduced-dynamics trees: header, verification, plots",
    "log": "run logs: summary, export, plot",
    "identify": "identification: 'pkrt identify LOG...' from run logs, 'pkrt identify plan' an exciting trajectory",
    "calibrate": "geometric calibration: 'pkrt calibrate LOG MEASURED.csv' from an instrument's readings, "
                 "'pkrt calibrate plan' measurement poses",
    "protect": "contact detection: 'pkrt protect tune LOG...' thresholds from logs of normal runs",
}

# The one place errors become exit codes: the first class an error is an instance of decides.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (Stopped, 1),       # a stop signal ended the run
    (Fault, 1),         # a fault at run time
    (CheckFailed, 1),   # a check ran and failed
    (ModelFailure, 2),  # the model cannot be computed there: the input is the user's to change
    (OutputError, 2),   # an output was not written
    (UserError, 2),     # bad input or usage
)
ERRORS = tuple(cls for cls, _ in EXIT_CODES)


def exit_code(error: BaseException) -> int:
    """The exit code of an error of one of the ``EXIT_CODES`` classes."""
    return next(code for cls, code in EXIT_CODES if isinstance(error, cls))


_NUM = re.compile(r"^-[0-9.]")


def _join_negative_values(argv: list[str]) -> list[str]:
    """Turn ``--opt -0.1,0.2`` into ``--opt=-0.1,0.2`` so argparse accepts negative vectors."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" not in a and i + 1 < len(argv) and _NUM.match(argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def _find_verb(argv: list[str]) -> str | None:
    """The verb the command line names (its first words), so that only its module is imported."""
    words = [a for a in argv if not a.startswith("-")][:2]
    if len(words) >= 2 and f"{words[0]} {words[1]}" in COMMANDS:
        return f"{words[0]} {words[1]}"
    if words and words[0] in COMMANDS:
        return words[0]
    return None


def _refuse_empty_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """An option given an empty value (``--inject=``, ``--log ""``) is a mistake, never "off"."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if isinstance(value, str) and not value:
            name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
            parser.error(f"{name}: expected a value, got an empty string")


def one_line(error: BaseException) -> str:
    """An error's message on one line (a message of several lines is joined with '; '), every
    overlong word in it cut to an excerpt (no message echoes a whole input)."""
    return shorten_tokens("; ".join(line.strip() for line in str(error).splitlines() if line.strip()))


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        where = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        raise UserError(f"{where}{message}")


EPILOG = "Every verb takes --help. Exit codes: 0 ok, 1 fault at run time or failed check, 2 bad input."


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: a subparser per verb (inside its group's for two-word verbs);
    ``verb``'s module is imported and adds that verb's arguments (the others stay empty)."""
    top = _Parser(prog="pkrt", description="pkrt: real-time controller runtime for parallel robots",
                  epilog=EPILOG)
    top.add_argument("--debug", action="store_true", help="show tracebacks")
    verbs = top.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser, required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for name, (module, text) in COMMANDS.items():
        words = name.split()
        if len(words) == 2 and verb == words[0]:  # the group's own verb is run ("pkrt identify LOG")
            continue
        if len(words) == 1 and name in groups:  # a group that is also a verb, not the one run
            continue
        if len(words) == 2:
            if words[0] not in groups:
                g = verbs.add_parser(words[0], help=GROUPS[words[0]], description=GROUPS[words[0]], epilog=EPILOG)
                groups[words[0]] = g.add_subparsers(dest="group_verb", metavar="VERB", parser_class=_Parser,
                                                    required=True)
            p = groups[words[0]].add_parser(words[1], help=text, description=text)
        else:
            p = verbs.add_parser(name, help=text, description=text)
        p.set_defaults(command=name)
        if name == verb:
            add_arguments, run = importlib.import_module(module).VERBS[name]
            p.add_argument("--debug", action="store_true", help="show tracebacks")
            add_arguments(p)
            p.set_defaults(run=run, verb_parser=p)
    return top


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line of a verb (``args.run`` runs it); a usage error is a UserError."""
    if not argv:
        build_parser().print_help()
        raise UserError("no verb given (try 'pkrt --help')")
    verb = _find_verb(argv)
    if verb is None and argv[0] not in ("-h", "--help") and argv[0] not in GROUPS:
        raise UserError(f"unknown verb '{' '.join(a for a in argv[:2] if not a.startswith('-'))}' "
                        f"(try 'pkrt --help')")
    args, extra = build_parser(verb).parse_known_args(_join_negative_values(argv))
    if extra:
        raise UserError(f"{args.command}: unrecognized arguments: {' '.join(extra)}")
    _refuse_empty_values(args.verb_parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        with numeric_warnings_raised():
            args = parse(argv)
            args.debug = debug
            return int(args.run(args) or 0)
    except RuntimeWarning as e:  # a computation on the user's values overflowed: never printed as a warning
        return _failed(numeric_error(e), debug)
    except Stopped as e:  # a KeyboardInterrupt: before the handler below
        return _failed(e, debug)
    except KeyboardInterrupt:
        print("pkrt: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # --help printed
        return int(e.code or 0) if isinstance(e.code, int) else 0
    except BrokenPipeError:
        return 0
    except (*ERRORS, OSError) as e:
        return _failed(e, debug)


def _failed(e: BaseException, debug: bool) -> int:
    """One line on stderr for an error a user can cause, and its exit code (``--debug``: the
    traceback first). A stop signal before the run's loop is one line too (torque never on,
    or off). Files that cannot be read or written are the user's to fix (exit 2)."""
    if debug and not isinstance(e, Stopped):
        traceback.print_exc()
    if isinstance(e, ERRORS):
        print(f"pkrt: error: {one_line(e)}", file=sys.stderr)
        return exit_code(e)
    print(f"pkrt: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
    return 2
