"""Error types shared by every layer, one per cause. Each says what happened; the CLI alone
maps them to exit codes (``pkrt.rt.cli.EXIT_CODES``)."""


class UserError(Exception):
    """Bad input or usage: a malformed file, an unknown name, an impossible option."""


class ModelFailure(Exception):
    """A computation on the model failed: a configuration that cannot be assembled (Newton
    did not converge), a singular configuration."""


class OutputError(Exception):
    """An output was not written (cannot create it, disk full, ...); nothing half-written is
    left behind."""


class CheckFailed(Exception):
    """A check ran and failed: a tree's verification, a model check's warnings, a HIL run
    whose injected fault was not detected in time."""


class Fault(Exception):
    """A fault at run time: a safety stop, a drive or bus fault, a helper process that died."""


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) that ended a run before its loop or
    interrupted a stuck cycle; a KeyboardInterrupt so that no ``except Exception`` swallows it.
    The message is the reason."""
