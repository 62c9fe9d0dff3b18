"""The verbs section of the command-line page (``docs/cli.md``), from the parsers themselves.

The documentation site's build (``mkdocs_hooks.py``) puts ``verbs_markdown()`` where the page
has ``<!-- pkrt verbs -->``: every verb's ``--help`` as ``pkrt VERB --help`` prints it, so the
page cannot drift from the options. It is generated at build time, not committed, because
argparse's layout differs between Python versions.
"""

from __future__ import annotations

import contextlib
import io
import os

from pkrt.rt.cli import COMMANDS, main

MARKER = "<!-- pkrt verbs -->"
WIDTH = 100  # help text columns (argparse reads COLUMNS)


def verb_help(verb: str) -> str:
    """What ``pkrt VERB --help`` prints."""
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*verb.split(), "--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip() + "\n"


def verbs_markdown() -> str:
    """A table of the verbs, then one section per verb with its help text."""
    lines = ["| verb | what it does |", "|---|---|"]
    lines += [f"| [`pkrt {verb}`](#pkrt-{verb.replace(' ', '-')}) | {text} |" for verb, (_, text) in COMMANDS.items()]
    for verb in COMMANDS:
        lines += ["", f"### pkrt {verb}", "", "```text", verb_help(verb).rstrip(), "```"]
    return "\n".join(lines) + "\n"
