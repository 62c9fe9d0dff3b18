"""The tool-path previews of the panel: a G-code program of the programs directory checked whole
as the served machine checks it before running it (``pkrt.rt.app.reference.check_gcode``: the
machine's configuration, its tool table and work offsets, its workspace), in a thread of the
panel's process (never the loop's), and its bounded preview (at most ``POINTS`` points in task
coordinates, m, each with its program line) handed to the page; or the one line that refuses
the program. Results are kept per file while its size and modification time (and the
configuration's) stay the same."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from pkrt.rt.core.errors import UserError

POINTS = 20_000  # a preview's points at most, whatever the program's length
KEPT = 8  # previews kept


class Previews:
    """``get(config, file, done)``: ``done(reply)`` is called (from the worker thread) with
    ``{"ok": True, "file", "name", "preview": Preview.to_json() + the check's figures}``, or
    ``{"ok": False, "error": one line}`` when the check refuses the program."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pkrt-panel-preview")
        self.lock = threading.Lock()
        self.machines: dict[str, tuple] = {}  # configuration path -> (its mtime, planner, setup, ranges)
        self.cache: dict[tuple, dict] = {}

    def get(self, config: str, file: str, done) -> None:
        self.pool.submit(lambda: done(self._reply(config, file)))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _machine(self, config: str):
        """The planner, setup and position limits of the configuration (read again when its
        file changed: a machine restarted with other offsets)."""
        stamp = os.stat(config).st_mtime_ns
        if self.machines.get(config, (None,))[0] != stamp:
            from pkrt.rt.app.reference import gcode_setup, path_planner
            from pkrt.rt.runtime.machine.config import load_machine

            c = load_machine(config)
            self.machines[config] = (stamp, path_planner(c), gcode_setup(c), c.limits.position)
        return self.machines[config][1:]

    def _reply(self, config: str, file: str) -> dict:
        try:
            st = os.stat(file)
            key = (config, os.stat(config).st_mtime_ns, file, st.st_size, st.st_mtime_ns)
            with self.lock:
                if key in self.cache:
                    return self.cache[key]
            from pkrt.rt.app.reference import check_gcode

            planner, setup, ranges = self._machine(config)
            got = check_gcode(planner, file, setup=setup, ranges=ranges, preview_points=POINTS)
            s = got.summary()
            reply = {"ok": True, "file": file, "name": os.path.basename(file),
                     "preview": {**got.preview.to_json(), "lines_total": s["lines"], "motions": s["motions"], "box_m": s["box_m"],
                                 "feed_time_s": s["feed_time_s"], "check_s": s["seconds"]}}
        except UserError as e:
            reply = {"ok": False, "file": file, "error": str(e)}
        except OSError as e:
            return {"ok": False, "file": file, "error": f"{file}: cannot read: {e.strerror}"}
        except Exception as e:  # noqa: BLE001 - a model that does not load: one line to the page
            return {"ok": False, "file": file, "error": f"no preview: {type(e).__name__}: {e}"}
        with self.lock:
            self.cache[key] = reply
            while len(self.cache) > KEPT:
                self.cache.pop(next(iter(self.cache)))
        return reply
