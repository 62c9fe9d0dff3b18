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
