"""A real Jupyter kernel (ipykernel via jupyter_client) for tests, and an IOPub traffic counter."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field

from jupyter_client.manager import KernelManager


@dataclass
class CellResult:
    """What one execute request produced on IOPub."""

    stdout: str = ""
    stderr: str = ""
    error: dict | None = None
    data: list[dict] = field(default_factory=list)  # display_data / execute_result bundles

    @property
    def text(self) -> str:
        return self.stdout + "".join(d.get("text/plain", "") for d in self.data)


class Kernel:
    """A python3 kernel started by jupyter_client (as JupyterLab would), in ``cwd``."""

    def __init__(self, cwd: str, env: dict | None = None):
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd, env={**os.environ, **(env or {})})
        self._connect()

    def _connect(self):
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 180, allow_error: bool = False) -> CellResult:
        result = CellResult()

        def hook(msg):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                else:
                    result.stderr += content["text"]
            elif kind in ("display_data", "execute_result"):
                result.data.append(content["data"])
            elif kind == "error":
                result.error = content

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout, allow_stdin=False)
        if reply["content"]["status"] == "error" and result.error is None:
            result.error = reply["content"]
        if result.error and not allow_error:
            raise AssertionError(f"cell failed: {result.error.get('ename')}: {result.error.get('evalue')}\n{code}")
        return result

    def value(self, expr: str, timeout: float = 120):
        """Evaluate ``expr`` in the kernel; return it (JSON round trip)."""
        out = self.run(f"import json as _j; print(_j.dumps({expr}))", timeout=timeout).stdout
        return json.loads(out.strip().splitlines()[-1])

    def interrupt_process_group(self) -> None:
        """SIGINT to the kernel's whole process group, as a terminal or some front ends do."""
        os.killpg(os.getpgid(self.pid), signal.SIGINT)

    def restart(self) -> None:
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self._connect()

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


class IOPubCounter:
    """Counts every IOPub message a kernel broadcasts (all cells, and between cells), with sizes."""

    def __init__(self, kernel: Kernel):
        import zmq

        # its own zmq context: stopping this listener must never touch the test's main client
        self._context = zmq.Context()
        self.kc = kernel.km.client(context=self._context)
        self.kc.start_channels(shell=False, stdin=False, hb=False, control=False)
        self.events: list[tuple[float, int, str]] = []  # (time, bytes, msg_type)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="iopub-counter", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            size = len(json.dumps(msg["content"], default=str)) + len(json.dumps(msg["header"], default=str))
            self.events.append((time.monotonic(), size, msg["msg_type"]))

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.kc.stop_channels()
        self._context.destroy(linger=0)

    def worst_window(self, start: float, end: float, window_s: float = 3.0) -> tuple[float, float]:
        """Highest (messages/s, bytes/s) averaged over any ``window_s`` window in [start, end]."""
        evs = [(t, b) for t, b, _ in self.events if start <= t <= end]
        worst_msgs = worst_bytes = 0.0
        for i, (t0, _) in enumerate(evs):
            inside = [b for t, b in evs[i:] if t < t0 + window_s]
            worst_msgs = max(worst_msgs, len(inside) / window_s)
            worst_bytes = max(worst_bytes, sum(inside) / window_s)
        return worst_msgs, worst_bytes
