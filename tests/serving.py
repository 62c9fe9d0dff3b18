"""Helpers of the tests of served machines."""

from __future__ import annotations

from contextlib import contextmanager

from pkrt.rt.app.client import MachineClient


@contextmanager
def ready_client(srv, timeout: float = 60.0):
    """A client of the served machine ``srv`` (a ``Served``), enabled, homed and at standstill."""
    with MachineClient(srv.socket_path, timeout=timeout) as cl:
        if cl.status()["state"] == "disabled":
            cl.enable()
        if not cl.status()["homed"]:
            cl.home()
        cl.wait_state("standstill", timeout=timeout)
        yield cl


@contextmanager
def serving(machine: str, d, **kw):
    """``machine`` served (its loop in a thread) with its socket and log in the folder ``d``."""
    from pkrt.rt.app.serve import Served

    s = Served(machine, socket_path=str(d / "m.sock"), log_path=str(d / "m.pktlog"), **kw)
    s.start()
    try:
        yield s
    finally:
        s.close()
