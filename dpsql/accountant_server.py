"""The server's long-lived accountant: ``python -m dpsql.accounting --serve <socket>``.

PostgreSQL cannot import Python, so DP-SGD's accountant (:mod:`dpsql.accounting`) runs outside
it. Starting a process per call cost about a second of imports and one process per concurrent
analyst (issue 17). Instead a background worker of the extension (sql/src/accountant_worker.c)
starts this process as its child, and the backends connect to it on a Unix socket in the data
directory (a directory only the server's user can enter: nobody else can connect, or bind the
name first and answer with made-up noise).

Protocol: a backend sends one request line (the JSON object ``python -m dpsql.accounting`` takes
as its argument) and reads one answer line, ``<exit status> <json>``: the status and the line the
command line would have printed. Then the connection closes.

Requests are answered one at a time, in the order they connect (a request answered a moment ago
is answered again from memory); the others wait in the listen queue (their backends wait on
their latches, so a cancel or statement timeout still interrupts them). A request that takes
longer than ``--request-timeout`` seconds is answered with an error (status 1). After
``--idle-exit`` seconds without a request the process removes its socket, answers whatever was
already queued, and exits; so does it when its parent (the worker) is gone.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import stat
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from dpsql import accounting

__all__ = ["main", "serve"]

#: Exit when no request came for this long (seconds); the next call starts a new process.
IDLE_EXIT_SECONDS = 600.0
#: One request may compute for at most this long (seconds).
REQUEST_TIMEOUT_SECONDS = 300
#: Longest request line read (the server builds requests much shorter than this).
MAX_REQUEST_BYTES = 1 << 20
#: A connected backend must send its line within this (seconds).
READ_TIMEOUT_SECONDS = 10.0


# Answers are a deterministic function of the request: sessions that ask the same new
# configuration at once (before the first answer reaches dpsql.accountant_answers) get it once.
_ANSWERS: dict[str, dict[str, Any]] = {}
_ANSWERS_SIZE = 256


class _RequestTimeout(BaseException):
    """Raised by SIGALRM: a BaseException, so that the request's own handlers let it through."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _RequestTimeout


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


def _answer_one(conn: socket.socket, request_timeout: int) -> None:
    with conn:
        try:
            line = _read_line(conn)
        except OSError:
            return
        if line is None:
            return
        cached = _ANSWERS.get(line)
        if cached is not None:
            status, obj = 0, cached
        else:
            signal.alarm(request_timeout)
            try:
                status, obj = accounting.answer(line)
            except _RequestTimeout:
                status, obj = 1, {"error": f"the accountant took more than {request_timeout} s"}
            finally:
                signal.alarm(0)
            if status == 0:
                if len(_ANSWERS) >= _ANSWERS_SIZE:
                    _ANSWERS.clear()
                _ANSWERS[line] = obj
        try:
            conn.settimeout(READ_TIMEOUT_SECONDS)
            conn.sendall(f"{status} {accounting.dumps(obj)}\n".encode())
        except OSError:
            pass  # the backend gave up (cancel, timeout): nothing to do


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
    accounting.quiet()
    parent = os.getppid()
    signal.signal(signal.SIGALRM, _on_alarm)
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    sock = _bind(path)
    ino = os.lstat(path).st_ino
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    last = time.monotonic()
    try:
        while not stop:
            if not sel.select(timeout=1.0):
                if os.getppid() != parent or time.monotonic() - last > idle_exit:
                    break
                continue
            conn, _ = sock.accept()
            _answer_one(conn, request_timeout)
            last = time.monotonic()
        # New callers find no socket and start a successor; the queued ones are answered.
        _unlink_if_ours(path, ino)
        sock.setblocking(False)
        while not stop:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                break
            conn.setblocking(True)
            _answer_one(conn, request_timeout)
    finally:
        _unlink_if_ours(path, ino)
        sock.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dpsql.accounting --serve <socket> [--idle-exit S] [--request-timeout S]``."""
    parser = argparse.ArgumentParser(prog="python -m dpsql.accounting --serve")
    parser.add_argument("socket", help="path of the Unix socket (relative: the data directory)")
    parser.add_argument("--idle-exit", type=float, default=IDLE_EXIT_SECONDS)
    parser.add_argument("--request-timeout", type=int, default=REQUEST_TIMEOUT_SECONDS)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return serve(args.socket, idle_exit=args.idle_exit, request_timeout=args.request_timeout)
