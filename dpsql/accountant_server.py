"""The server's long-lived accountant: ``python -m dpsql.accounting --serve <socket>``.

PostgreSQL cannot import Python, so DP-SGD's accountant (:mod:`dpsql.accounting`, its requests
and answers in :mod:`dpsql.accountant_requests`) runs outside it. Starting a process per call cost
about a second of imports and one process per concurrent analyst (issue 17). Instead a
background worker of the extension (sql/src/accountant_worker.c) starts this process as its
child, and the backends connect to it on a Unix socket in the data directory (a directory only the
server's user can enter: nobody else can connect, or bind the name first and answer with made-up
noise).

Protocol: a backend sends one request line (the JSON object ``python -m dpsql.accounting`` takes
as its argument) and reads one answer line, ``<exit status> <json>``: the status and the line the
command line would have printed. Then the connection closes.

Requests are computed in child processes forked from this one (its imports already done), at
most ``SLOTS`` at once across the server (the slot files the backends' fallback processes lock
too, sql/src/accountant.h): a slow request holds one slot and others keep being served (issue 24).
A child is killed when its backend hangs up (a cancel, a statement or accountant timeout) and
after ``--request-timeout`` seconds (dpsql.accountant_timeout; 0: none; answered with an error,
status 1); its CPU time is limited
as well, should this process die first. Requests already answered are answered again from
memory; a request asked again while it is computed waits for the same child. After
``--idle-exit`` seconds without a request the process removes its socket, answers whatever was
already queued, and exits; so does it when its parent (the worker) is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import resource
import selectors
import signal
import socket
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from dpsql import accountant_requests, calibration_cache

__all__ = ["main", "serve"]

#: Exit when no request came for this long (seconds); the next call starts a new process.
IDLE_EXIT_SECONDS = 600.0
#: One request may compute for at most this long (seconds).
REQUEST_TIMEOUT_SECONDS = 300
#: Longest request line read (the server builds requests much shorter than this).
MAX_REQUEST_BYTES = 1 << 20
#: A connected backend must send its line within this (seconds).
READ_TIMEOUT_SECONDS = 10.0


#: Computing children at once: ACCOUNTANT_SLOTS of sql/src/accountant.h (the same slot files).
SLOTS = 2
_SLOT_FILE = "pg_dpsql_accountant.slot{}"

# Answers are a deterministic function of the request: sessions that ask the same new
# configuration at once (before the first answer reaches dpsql.accountant_answers) get it once.
_ANSWERS: dict[str, dict[str, Any]] = {}
_ANSWERS_SIZE = 256


def _read_line(conn: socket.socket) -> str | None:
    conn.settimeout(READ_TIMEOUT_SECONDS)
    data = bytearray()
    while b"\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            return None
    return data.split(b"\n", 1)[0].decode("utf-8", errors="replace")


def _reply(conn: socket.socket, status: int, obj: dict[str, Any]) -> None:
    with conn:
        try:
            conn.settimeout(READ_TIMEOUT_SECONDS)
            conn.sendall(f"{status} {accountant_requests.dumps(obj)}\n".encode())
        except OSError:
            pass  # the backend gave up (cancel, timeout): nothing to do


def _try_slot(directory: str) -> int | None:
    """A free slot's fd (flock held; a child that inherits it holds it until it exits)."""
    for i in range(SLOTS):
        path = os.path.join(directory, _SLOT_FILE.format(i))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
    return None


def _compute(line: str, slot: int, out: int, cpu_seconds: int) -> None:
    """The child: answer one request on ``out`` and exit (never returns)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        keep = sorted((slot, out))
        os.closerange(3, keep[0])  # the listening socket and other backends' connections
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, 65536)
        if cpu_seconds > 0:
            # the deadline holds even if this server dies: the kernel stops the child
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        status, obj = accountant_requests.answer(line)
        os.write(out, f"{status} {accountant_requests.dumps(obj)}\n".encode())
    finally:
        os._exit(0)


@dataclass
class _Job:
    """One request being computed (or waiting for a slot), and the backends waiting for it."""

    line: str
    conns: list[socket.socket] = field(default_factory=list)
    pid: int = 0
    pipe: int = -1
    deadline: float = 0.0
    output: bytearray = field(default_factory=bytearray)


class _Server:
    def __init__(self, sock: socket.socket, request_timeout: int, slots: str = "") -> None:
        self.sock = sock
        self.slots = slots  # the slot files' directory: the socket's (the data directory)
        self.request_timeout = request_timeout
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)
        self.jobs: dict[str, _Job] = {}  # by request line

    def busy(self) -> bool:
        return bool(self.jobs)

    def accept(self) -> None:
        conn, _ = self.sock.accept()
        conn.setblocking(True)
        try:
            line = _read_line(conn)
        except OSError:
            line = None
        if line is None:
            conn.close()
            return
        cached = _ANSWERS.get(line)
        if cached is not None:
            _reply(conn, 0, cached)
            return
        job = self.jobs.setdefault(line, _Job(line))
        job.conns.append(conn)
        # the backend sends nothing more: its socket turns readable when it hangs up
        self.sel.register(conn, selectors.EVENT_READ, ("conn", job))

    def hung_up(self, conn: socket.socket, job: _Job) -> None:
        self.sel.unregister(conn)
        conn.close()
        job.conns.remove(conn)
        if not job.conns:
            self.finish(job, None)  # nobody waits for it: its work stops

    def start_waiting(self) -> None:
        for job in self.jobs.values():
            if job.pid:
                continue
            slot = _try_slot(self.slots)
            if slot is None:
                return
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                _compute(job.line, slot, write, self.request_timeout and self.request_timeout + 1)
            os.close(slot)
            os.close(write)
            job.pid, job.pipe = pid, read
            job.deadline = time.monotonic() + (self.request_timeout or math.inf)
            self.sel.register(read, selectors.EVENT_READ, ("pipe", job))

    def output(self, job: _Job) -> None:
        chunk = os.read(job.pipe, 65536)
        if chunk:
            job.output += chunk
            return
        try:
            status, _, rest = job.output.decode().partition(" ")
            answer = (int(status), json.loads(rest))
        except ValueError:
            answer = (1, {"error": "the accountant's computation ended without an answer"})
        self.finish(job, answer)

    def expire(self) -> None:
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if job.pid and now > job.deadline:
                error = f"the accountant took more than {self.request_timeout} s"
                self.finish(job, (1, {"error": error}))

    def finish(self, job: _Job, answer: tuple[int, dict[str, Any]] | None) -> None:
        """Stop the job's child (if any) and give its backends the answer (if any)."""
        del self.jobs[job.line]
        if job.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.pid, signal.SIGKILL)
            os.waitpid(job.pid, 0)
            self.sel.unregister(job.pipe)
            os.close(job.pipe)
        if answer is not None and answer[0] == 0:
            if len(_ANSWERS) >= _ANSWERS_SIZE:
                _ANSWERS.clear()
            _ANSWERS[job.line] = answer[1]
        for conn in job.conns:
            self.sel.unregister(conn)
            if answer is None:
                conn.close()
            else:
                _reply(conn, *answer)

    def step(self, timeout: float) -> bool:
        """Handle what is ready within ``timeout``; False if nothing was."""
        if any(not job.pid for job in self.jobs.values()):
            timeout = min(timeout, 0.05)  # waiting for a slot: look again soon
        events = self.sel.select(timeout=timeout)
        for key, _ in events:
            if key.fileobj is self.sock:
                with contextlib.suppress(BlockingIOError):
                    self.accept()
            elif key.data[0] == "conn":
                if key.data[1].line in self.jobs:
                    self.hung_up(key.fileobj, key.data[1])  # type: ignore[arg-type]
            elif key.data[1].line in self.jobs:
                self.output(key.data[1])
        self.expire()
        self.start_waiting()
        return bool(events)

    def stop(self) -> None:
        for job in list(self.jobs.values()):
            self.finish(job, None)


def _bind(path: str) -> socket.socket:
    """Listen on ``path``, replacing a stale socket left by a process that crashed."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def _unlink_if_ours(path: str, ino: int) -> None:
    try:
        if os.lstat(path).st_ino == ino:
            os.unlink(path)
    except FileNotFoundError:
        pass


def serve(
    path: str,
    *,
    idle_exit: float = IDLE_EXIT_SECONDS,
    request_timeout: int = REQUEST_TIMEOUT_SECONDS,
) -> int:
    """Answer requests on the Unix socket ``path`` until idle or orphaned; the exit status."""
    accountant_requests.quiet()
    _warm_up()
    parent = os.getppid()
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    sock = _bind(path)
    ino = os.lstat(path).st_ino
    sock.setblocking(False)
    server = _Server(sock, request_timeout, os.path.dirname(path))
    last = time.monotonic()
    closing = False
    try:
        while not stop:
            if server.step(1.0) or server.busy():
                last = time.monotonic()
                continue
            if closing:
                break  # the socket is gone and what was queued is answered
            if os.getppid() != parent or time.monotonic() - last > idle_exit:
                # New callers find no socket and start a successor; the queued ones are answered.
                _unlink_if_ours(path, ino)
                closing = True
    finally:
        server.stop()
        _unlink_if_ours(path, ino)
        sock.close()
    return 0


def _warm_up() -> None:
    """Import what requests need once, here, rather than in every child."""
    import importlib

    for target in accountant_requests.MODULE_OPS.values():
        with contextlib.suppress(Exception):
            importlib.import_module(target.split(":")[0])
    accountant_requests.answer(
        '{"op": "epsilon", "scheme": "poisson", "noise_multiplier": 1, "delta": 1e-6, '
        '"steps": 2, "sampling_rate": 0.5}'
    )
    # read the calibration grid here: the forked children share it instead of each parsing it
    calibration_cache.load()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpsql.accounting --serve <socket> [--idle-exit S] [--request-timeout S]``
    (started by the block at the end of dpsql/accounting.py)."""
    parser = argparse.ArgumentParser(prog="python -m dpsql.accounting --serve")
    parser.add_argument("socket", help="path of the Unix socket (relative: the data directory)")
    parser.add_argument("--idle-exit", type=float, default=IDLE_EXIT_SECONDS)
    parser.add_argument("--request-timeout", type=int, default=REQUEST_TIMEOUT_SECONDS)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return serve(args.socket, idle_exit=args.idle_exit, request_timeout=args.request_timeout)
