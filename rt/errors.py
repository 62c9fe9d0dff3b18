"""Error types shared by every layer. The CLI maps them to exit codes."""


class UserError(Exception):
    """Bad input or usage (a malformed file, an unknown name, an impossible option): exit 2."""

    exit_code = 2


class Fault(Exception):
    """A fault or failed check at run time (safety stop, drive fault, verification): exit 1."""

    exit_code = 1


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that ended a run before its loop or
    interrupted a stuck cycle; a KeyboardInterrupt so that no ``except Exception`` swallows it.
    The message is the reason: exit 1."""

    exit_code = 1
