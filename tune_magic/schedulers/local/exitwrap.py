"""The tiny process between a job's supervisor and its command: it records the exit code.

Run by path (``python -I -S exitwrap.py EXIT_FILE -- ARGV...``), importing nothing of tune_magic so
it starts in milliseconds. It starts ARGV in a new session (the torchrun agent, or the one recipe
process), waits for it, and writes ``{"returncode": N, "ended_at": T}`` to EXIT_FILE; a negative
code means killed by that signal. Because it is its own process, the exit code survives the
supervisor being killed: whoever looks next (a listing, a new kernel) settles the job from it.

The file is created and padded with spaces at start, so the final code can be written into the
same blocks even when the disk has filled meanwhile; if the job's directory was deleted and
recreated meanwhile, it is also written at the path. The wrapper then exits the way the job did
(the same code, or the same signal), so its parent sees what the job did.

Format of EXIT_FILE: this file's; read by ``tune_magic.registry.store.read_exit_code``.
"""

import json
import os
import signal
import sys
import time

PAD = 128


def _write(fd, path, code):
    data = json.dumps({"returncode": code, "ended_at": time.time()}).encode().ljust(PAD)
    same = False
    if fd is not None:
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
            st, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
        except OSError:
            same = False
    if same:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    for _ in range(3):  # the directory was recreated (or never had the file): write at the path
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(out, data)
            finally:
                os.close(out)
            os.replace(tmp, path)
            return
        except OSError:
            time.sleep(0.2)


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: exitwrap.py EXIT_FILE -- COMMAND...\n")
        return 2
    path, command = argv[0], argv[2:]
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if os.fstat(fd).st_size == 0:
            os.write(fd, b" " * PAD)
    except OSError:
        fd = None
    pid = os.fork()
    if pid == 0:  # the job: its own session, so "every process of it" is findable and killable
        try:
            os.setsid()
            for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # ignored by the supervisor
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"tune_magic: could not start {command[0]}: {exc}\n".encode())
        os._exit(127)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    # a SIGTERM meant for the supervisor's session (e.g. a shutdown) reaches the job, which ends
    # normally and gets recorded; SIGINT/SIGHUP never reach this session
    signal.signal(signal.SIGTERM, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status = 127 << 8
            break
    code = os.waitstatus_to_exitcode(status)
    _write(fd, path, code)
    if code < 0:  # end the way the job did, so the supervisor's wait sees the same signal
        try:
            if -code not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        except (OSError, ValueError):
            pass
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
