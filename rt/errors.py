"""Error types shared by every layer. The CLI maps them to exit codes."""


class UserError(Exception):
    """Bad input or usage (a malformed file, an unknown name, an impossible option): exit 2."""

    exit_code = 2


class Fault(Exception):
    """A fault or failed check at run time (safety stop, drive fault, verification): exit 1."""

    exit_code = 1
