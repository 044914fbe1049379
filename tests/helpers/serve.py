"""``rocketspark serve`` for a test session: one server process over a store of the run.

``tests/conftest.py`` starts one :class:`ServeProcess` per test run, when a test first
asks for the ``rocketspark_serve`` fixture (the "serve" backend of
``tests/helpers/backends.py``), and stops it (SIGTERM) when the run ends. It runs the
command users run (``python -m rocketspark.cli --store DIR serve ...``) on free loopback
ports, with the broker settings of :data:`SETTINGS` in a broker.conf of its own; its
log (WARNING and up) goes to ``serve.log`` in the run directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.jvm import free_port

ROOT = Path(__file__).resolve().parents[2]
# As the cluster's brokers run (tests/helpers/cluster.py): every delay level one second
# (the backends' FAST), and half messages older than 3 s are checked back.
SETTINGS: dict[str, object] = {
    "messageDelayLevel": " ".join(["1s"] * 18),
    "transactionTimeOut": 3000,
}
START_SECONDS = 60.0
STOP_SECONDS = 60.0


class ServeProcess:
    """A ``rocketspark serve`` over ``run_dir/store``: ``namesrv`` and ``broker`` are its
    addresses ("127.0.0.1:port"), ``store`` its directory, ``log`` its stderr."""

    def __init__(self, run_dir: Path) -> None:
        self.store = run_dir / "store"
        self.log = run_dir / "serve.log"
        conf = run_dir / "broker.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in SETTINGS.items()))
        ns, broker = free_port(), free_port()
        self.namesrv = f"127.0.0.1:{ns}"
        self.broker = f"127.0.0.1:{broker}"
        t0 = time.monotonic()
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rocketspark.cli",
                    "--store",
                    str(self.store),
                    "serve",
                    "--config",
                    str(conf),
                    "--listen",
                    self.namesrv,
                    "--broker-port",
                    str(broker),
                    "--log-level",
                    "WARNING",
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(_path())),
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # one line, once both ports listen
        if not line.startswith("serving "):
            self.close()
            raise RuntimeError(f"rocketspark serve did not start: {line!r}\n{self.tail()}")
        self.started = time.monotonic() - t0

    def tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check(self) -> None:
        """Raise if the server is no longer running (with its log's end)."""
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"rocketspark serve exited with {code}:\n{self.tail()}")

    def close(self) -> int:
        """SIGTERM, then wait (SIGKILL after STOP_SECONDS); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_SECONDS)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def _path() -> list[str]:
    """PYTHONPATH for the server: this checkout first (as the tests import it)."""
    rest = os.environ.get("PYTHONPATH", "")
    return [str(ROOT), *(p for p in rest.split(os.pathsep) if p)]
