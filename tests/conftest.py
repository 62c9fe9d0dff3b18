"""Fixtures shared by the runtime tests: the Orthoglide's simulated machine configuration and
its controller tree (modules that need another machine define their own ``config``)."""

from __future__ import annotations

import pytest

from pkrt.rt.runtime.config import load_machine
from pkrt.rt.runtime.run import load_controller_tree


@pytest.fixture(scope="module")
def config():
    return load_machine("orthoglide")


@pytest.fixture(scope="module")
def tree(config):
    return load_controller_tree(config)


@pytest.fixture(scope="session")
def host_probe():
    """The independent host-pause probe (pkrt.rt.core.hostprobe), one process per CPU, running
    from the first real-time test that asks for it to the end of the session
    (tests/realtime.py judges runs with it)."""
    from pkrt.rt.core.hostprobe import HostProbe

    with HostProbe() as probe:
        yield probe
