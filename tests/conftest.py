"""Fixtures shared by the runtime tests: the Orthoglide's simulated machine configuration and
its controller tree (modules that need another machine define their own ``config``)."""

from __future__ import annotations

import pytest

from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.machine.runsetup import load_controller_tree


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The suite runs on pytest-xdist workers (``-n auto --dist loadgroup``, the README's
    command): every real-time test (mark ``realtime``) in one group, run one after another on
    one worker beside the host-pause probe, so that two real-time runs never share the CPUs;
    every other test file a group of its own (its module fixtures built once), spread over the
    workers. A test that asks for the probe is a real-time test and must say so."""
    for item in items:
        realtime = item.get_closest_marker("realtime") is not None
        if "host_probe" in getattr(item, "fixturenames", ()) and not realtime:
            raise pytest.UsageError(f"{item.nodeid} uses host_probe: mark it @pytest.mark.realtime")
        group = "realtime" if realtime else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False) and hasattr(item, "_id"):
            # xdist 3.8 names the group in the node id (``nodeid@group``) by setting ``_nodeid``,
            # which pytest 9.2 no longer reads (its node id is ``_id``): without this every test
            # was scheduled alone, real-time ones on both workers at once
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{group}")


def pytest_terminal_summary(terminalreporter):
    """The browser the panel's tests drove (tests/test_panel_browser.py), one line at the end
    (the README's command runs pytest with ``-q``, which hides the report header)."""
    from pkrt.rt.panel.harness import versions

    v = versions()
    terminalreporter.write_line(f"browser: {v['chromium'] or 'none at ' + str(v['executable'])} ({v['executable']}); "
                                f"Playwright {v['playwright']}")
