"""The kept-alive generation processes of this Python process: one per (job, checkpoint), reused.

The first :meth:`tune_magic.job.Job.generate` of a job and checkpoint starts
``recipes/generate_text.py`` in serve mode (docs/generation.md) where the job ran
(:func:`tune_magic.job.generate.command`); it loads the model once, and every later prompt of
this Python process for that job and checkpoint is one JSON line to it and one back. It ends:

* after :data:`IDLE_TIMEOUT_S` seconds without a request (the recipe's own ``idle_timeout_s``);
* when this Python process exits (``atexit``), or dies (its stdin pipe closes: the recipe ends);
* on :func:`close_generators` (``tune_magic.close_generators()``, ``Job.close_generation()``).

A process that ended (idle, killed, a crash) is started again by the next request, transparently,
also when it ends just as a request goes (once: a process started for a request that ends without
answering it raises :class:`~tune_magic.job.generate.GenerationError` with the recipe's paragraph).
A request interrupted (Ctrl-C) or timed out ends its process, so no late answer is read as the
next one's. Nothing here prints or touches a widget; partial text goes to the caller's callback,
in the caller's thread.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tune_magic.errors import PlanError
from tune_magic.job.generate import (ChosenCheckpoint, GenerationError, GenOptions, check_prompt, choose_checkpoint,
                                     command, failure_message, hold_checkpoint, log_file, start_process)

#: Seconds a kept-alive process waits for a request before it ends (the recipe's ``idle_timeout_s``).
IDLE_TIMEOUT_S = 300.0
#: Seconds one answer may take, process start and model load included (a cluster's queue too).
ANSWER_TIMEOUT_S = 900.0
#: Seconds :meth:`ServeProcess.close` waits after closing stdin, and again after SIGTERM.
CLOSE_GRACE_S = 5.0


class _Ended(GenerationError):
    """The process ended before it answered (internal: :meth:`ServeProcess.ask` starts it again or
    raises a :class:`~tune_magic.job.generate.GenerationError` of its own)."""


class ServeProcess:
    """One kept-alive generation process (started on the first :meth:`ask`).

    Attributes:
        key: ``(job id, checkpoint path or "base")``.
        argv: its command (``list[str]``; show it with ``shlex.join``).
        log_path: its stderr, appended to (``<job dir>/generate/serve-<checkpoint>.log``).
        starts: how many times a process was started for this key.
        last: the last answer (``dict``: ``text``, ``tokens``, ``prompt_tokens``, ``seconds``,
            ``stop``, ``request``, ``loads``, ``load_seconds``), or ``None``.
    """

    def __init__(self, key: tuple[str, str], argv: list[str], env: dict[str, str], cwd: str, log_path: Path,
                 hold: Callable[[], int | None] | None = None):
        self.key, self.argv, self.env, self.cwd, self.log_path = key, argv, env, cwd, log_path
        self.proc: subprocess.Popen | None = None
        self._hold = hold  # takes the checkpoint's in-use lock while a process reads it
        self._held: int | None = None
        self.starts = 0
        self.last: dict[str, Any] | None = None
        self._buffer = b""
        self._offset = 0
        self._sent = 0
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The live process's pid, else ``None``."""
        return self.proc.pid if self.alive else None

    @property
    def alive(self) -> bool:
        """Whether its process runs (an ended one is reaped here, and its checkpoint let go)."""
        running = self.proc is not None and self.proc.poll() is None
        if not running:
            self._release()
        return running

    def __repr__(self) -> str:
        return f"<ServeProcess {self.key[0]} {self.key[1]} pid={self.pid} starts={self.starts}: {shlex.join(self.argv)}>"

    def _start(self) -> None:
        """Start the process.

        Raises:
            GenerationError: it could not be started (its log or working directory unusable, the
                program missing).
        """
        self.proc, self._offset = start_process(self.argv, cwd=self.cwd, env=self.env, log=self.log_path,
                                                stdin=subprocess.PIPE)
        self._buffer = b""
        self.starts += 1
        if self._hold is not None and self._held is None:
            self._held = self._hold()

    def ask(self, request: dict[str, Any], on_partial: Callable[[str], None] | None = None,
            timeout_s: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        """Send one request (docs/generation.md's keys) and return its answer, starting the process
        first if none runs; a process started earlier that ended just as the request went (its idle
        timeout, a kill) is started again and asked once more.

        Args:
            on_partial: called with each piece of text as it arrives (``"stream": true`` requests).
            timeout_s: seconds the answer may take.

        Raises:
            GenerationError: the recipe refused the request (its paragraph; the process goes on), or
                the process ended or took longer than ``timeout_s`` (it is ended).
        """
        with self._lock:
            for again in (False, True):
                fresh = not self.alive
                if fresh:
                    self._start()
                try:
                    answer = self._exchange(request, on_partial, timeout_s)
                except _Ended:
                    if not fresh and not again:  # it ended (idle, killed) just as the request went
                        continue
                    code = self.proc.returncode
                    raise GenerationError(failure_message(self.log_path, self._offset, "the generation process ended "
                                                          f"(exit code {code}) without answering")) from None
                except BaseException:  # Ctrl-C, a timeout: its answer would be read as the next one's
                    self._kill()
                    raise
                if "error" in answer:
                    raise GenerationError(str(answer["error"]))
                self.last = answer
                return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _exchange(self, request: dict[str, Any], on_partial, timeout_s: float) -> dict[str, Any]:
        self._sent += 1
        ident = f"tm-{self._sent}"
        try:
            self.proc.stdin.write((json.dumps({**request, "id": ident}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._ended() from None
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._line(deadline, timeout_s)
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # not the protocol's (an engine's own word on stdout): skip it
            if not isinstance(obj, dict) or obj.get("id") != ident:
                continue
            if "partial" in obj:
                if on_partial is not None:
                    on_partial(str(obj["partial"]))
                continue
            return obj

    def _line(self, deadline: float, timeout_s: float) -> bytes:
        """The next line of stdout.

        Raises:
            _Ended: end of stdout. GenerationError: ``deadline`` passed.
        """
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GenerationError(f"no answer within {timeout_s:.0f} s: the generation process was ended; "
                                      f"its log is {self.log_path}")
            if select.select([fd], [], [], min(left, 1.0))[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise self._ended()
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _ended(self) -> _Ended:
        try:
            self.proc.wait(timeout=CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            self._kill()
        return _Ended()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            self.proc.wait()
        self._close_pipes()
        self._release()

    def _release(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout) if self.proc is not None else ():
            try:
                pipe.close()
            except OSError:
                pass

    def close(self, grace_s: float = CLOSE_GRACE_S) -> bool:
        """End the process: close its stdin (the recipe ends at the end of its input), after
        ``grace_s`` seconds SIGTERM, after ``grace_s`` more SIGKILL. Returns whether one ran."""
        if not self.alive:
            return False
        with self._lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            for sig in (None, signal.SIGTERM):
                if sig is not None:
                    self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout=grace_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            self._kill()
        return True


_PROCESSES: dict[tuple[str, str], ServeProcess] = {}
_REGISTRY_LOCK = threading.Lock()


def serve_process(job, chosen: ChosenCheckpoint) -> ServeProcess:
    """The kept-alive process of ``job`` (a :class:`~tune_magic.job.Job`) and ``chosen`` (made,
    not started, on first use; its command is built then)."""
    key = (job.id, chosen.path)
    with _REGISTRY_LOCK:
        process = _PROCESSES.get(key)
        if process is None:
            argv, env = command(job, chosen, ["generate.serve=true", f"generate.idle_timeout_s={IDLE_TIMEOUT_S:g}"])
            process = _PROCESSES[key] = ServeProcess(key, argv, env, job.record.cwd, log_file(job, chosen, "serve"),
                                                     hold=lambda: hold_checkpoint(job, chosen))
    return process


def generate(job, prompt: Any, *, checkpoint: Any = "last", max_new_tokens: Any = 64, temperature: Any = 0.0,
             top_k: Any = None, seed: Any = 0, on_text: Callable[[str], None] | None = None) -> str:
    """:meth:`tune_magic.job.Job.generate`: see there. Every check runs first; then the job's
    kept-alive process for the checkpoint answers (:func:`serve_process`)."""
    prompt = check_prompt(prompt)
    opts = GenOptions.checked(max_new_tokens, temperature, top_k, seed)
    if on_text is not None and not callable(on_text):
        raise PlanError(f"on_text={on_text!r}: give a function called with each new piece of text "
                        "(e.g. on_text=print), or None")
    chosen = choose_checkpoint(job, checkpoint, losses=False)
    return serve_process(job, chosen).ask(opts.request(prompt, stream=on_text is not None), on_text)["text"]


def generators(job_id: str | None = None) -> list[ServeProcess]:
    """The kept-alive processes of this Python process (of one job when ``job_id`` is given),
    running or not, in the order they were made."""
    with _REGISTRY_LOCK:
        return [p for key, p in _PROCESSES.items() if job_id is None or key[0] == job_id]


def close_generators(job_id: str | None = None) -> int:
    """End the kept-alive generation processes of this Python process (only ``job_id``'s when
    given; see :meth:`ServeProcess.close`); return how many were running. A later
    ``generate`` starts a new one."""
    with _REGISTRY_LOCK:
        keys = [k for k in _PROCESSES if job_id is None or k[0] == job_id]
        processes = [_PROCESSES.pop(k) for k in keys]
    return sum(1 for p in processes if p.close())


atexit.register(close_generators)
