"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): the browser reads
NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4. No driver binary, no websocket
library, nothing from the network: the lightest way to run a page in a real browser from the test suite and
from bench/view_speed.py.

    with Chromium.start() as browser:
        page = browser.open(url)           # a new tab, its console and exceptions recorded
        page.wait_for("window.hragView && window.hragView.ready")
        page.evaluate("1 + 1")
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe",
         # WebGL with no GPU: the software rasteriser, which newer Chromium only uses when asked
         "--enable-unsafe-swiftshader", "--use-angle=swiftshader"]
BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


def _high_fd(fd: int) -> int:
    """A copy of fd numbered 10 or more, so moving the pipes to 3 and 4 in the child never overwrites one."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int, profile: str) -> None:
        self.proc, self._w, self._r, self._profile = proc, write_fd, read_fd, profile
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    @classmethod
    def start(cls, binary: str | None = None, width: int = 1280, height: int = 800) -> "Chromium":
        binary = binary or find_chromium()
        if binary is None:
            raise BrowserError("no chromium binary on PATH")
        profile = tempfile.mkdtemp(prefix="hrag-chromium-")
        cmd_r, cmd_w = (_high_fd(fd) for fd in os.pipe())      # we write commands, the browser reads fd 3
        out_r, out_w = (_high_fd(fd) for fd in os.pipe())      # the browser writes fd 4, we read
        args = FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]


        def pipes_to_3_and_4() -> None:      # in the child: every other descriptor is non-inheritable (PEP 446)
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        proc = subprocess.Popen([binary, *args], preexec_fn=pipes_to_3_and_4, close_fds=False,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        return cls(proc, cmd_w, out_r, profile)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- the protocol ----------------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("no reply from chromium in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed its DevTools pipe")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Read the events that arrive within `seconds`."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except BrowserError:
            pass

    def open(self, url: str) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        page.navigate(url)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        return self.browser.send(method, params, session=self.session, timeout=timeout)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:60]!r} threw: {res['exceptionDetails'].get('text')} "
                               f"{res['exceptionDetails'].get('exception', {}).get('description', '')}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, poll: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}")
            time.sleep(poll)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors this page has had so far."""
        out = []
        for ev in self.browser.events:
            if ev.get("sessionId") != self.session:
                continue
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = params.get("exceptionDetails", {})
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        return out

    def type_text(self, selector: str, text: str) -> None:
        """Focus an element and type into it as a user would (input events included)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", {"text": text})

    def screenshot(self, scale: float = 1.0) -> bytes:
        """The viewport as PNG, scaled (a quarter-size shot decodes fast in png_pixels)."""
        params: dict[str, Any] = {"format": "png"}
        if scale != 1.0:
            size = self.evaluate("[innerWidth, innerHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": scale}
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGBA or RGB bytes) of an 8-bit non-interlaced PNG, as Chromium writes them."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", 0
    height = depth = ctype = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if depth != 8 or ctype not in (2, 6):
        raise ValueError(f"PNG depth {depth} colour type {ctype} not read here")
    bpp = 4 if ctype == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def file_url(path: Path) -> str:
    return Path(path).resolve().as_uri()
