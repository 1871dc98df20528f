"""A page opened in headless Chromium (Debian's `chromium`), driven over the DevTools protocol on
a pipe (`--remote-debugging-pipe`: no port, no driver, no extra package): what the console said,
every request that left the machine, each plotly figure's state, a PNG of the whole page and
its PDF print. The browser runs in its own session and its whole process group is stopped at
the end."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCAL = ("file:", "data:", "about:", "blob:", "chrome:", "devtools:")
FIGURES_JS = """JSON.stringify([...document.querySelectorAll('.plotly-graph-div')].map(d => ({
  id: d.id, traces: (d.data || []).length,
  drawn: !!d.querySelector('.main-svg') && d.getBoundingClientRect().height > 0})))"""
OVERFLOW_JS = "document.documentElement.scrollWidth - window.innerWidth"
SECTIONS_JS = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('section[id]')]
  .map(s => [s.id, Math.round(s.getBoundingClientRect().top + window.scrollY)])))"""


def _high(fd: int) -> int:
    """The same pipe end on a descriptor of 10 or more, so that bash's `3<&N 4>&M` cannot
    overwrite one end with the other (dash, Debian's sh, reads only one-digit descriptors)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def find() -> str | None:
    """The Chromium binary, or None where none is installed."""
    return next((p for name in ("chromium", "chromium-browser", "google-chrome")
                 if (p := shutil.which(name))), None)


@dataclass
class Visit:
    figures: list[dict] = field(default_factory=list)  # id, traces, drawn
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions
    requests: list[str] = field(default_factory=list)  # URLs other than file:, data:, ...
    overflow_px: int = 0  # how far the page is wider than the window
    sections: dict[str, int] = field(default_factory=dict)  # id -> its top, px from the top
    png: bytes = b""
    pdf: bytes = b""


class _Browser:
    """One Chromium process and its DevTools pipe (messages are JSON, each ended by a NUL)."""

    def __init__(self, binary: str, width: int, height: int):
        self.to_r, self.to_w = map(_high, os.pipe())  # we write, the browser reads (its fd 3)
        self.from_r, self.from_w = map(_high, os.pipe())  # it writes (its fd 4), we read
        self.profile = tempfile.mkdtemp(prefix="accel-chromium-")
        self.log = Path(self.profile) / "stderr.log"
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing leaves the machine
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "about:blank"]
        shell = f'exec "$0" "$@" 3<&{self.to_r} 4>&{self.from_w}'
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["bash", "-c", shell, binary, *args],
                                         pass_fds=(self.to_r, self.from_w),
                                         start_new_session=True, stdout=subprocess.DEVNULL,
                                         stderr=log)
        os.close(self.to_r)
        os.close(self.from_w)
        self.buffer, self.next_id, self.events = b"", 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 60) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"{method}: no answer within {timeout_s} s")

    def _read(self) -> dict:
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_r, 1 << 20)
            if not chunk:
                said = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Chromium closed its DevTools pipe; it said:\n{said}")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_event(self, method: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout_s} s")
            self.events.append(self._read())

    def stop(self) -> None:
        """The whole process group (the browser and its helpers), then the profile."""
        for fd in (self.to_w, self.from_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        if not _signal_and_wait(self.proc, signal.SIGTERM):
            _signal_and_wait(self.proc, signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def _signal_and_wait(proc: subprocess.Popen, sig: int, wait_s: float = 10.0) -> bool:
    """`sig` to the process group `proc` leads; whether the group is empty within `wait_s`."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the browser itself
        try:
            os.killpg(proc.pid, 0)  # anyone left in the group?
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                              for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            out.append("uncaught: " + str(details.get("exception", {}).get("description")
                                          or details.get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", ""))
    return out


def _evaluate(browser: _Browser, session: str, expression: str):
    result = browser.send("Runtime.evaluate", {"expression": expression,
                                               "returnByValue": True}, session)
    return result.get("result", {}).get("value")


def visit(path: Path, *, width: int = 1200, height: int = 900, settle_s: float = 30,
          binary: str | None = None) -> Visit:
    """Open `path` offline; wait until every plotly figure is drawn (up to `settle_s`); read
    the console, the requests, the figures, the overflow and where each section begins; take a
    full-page PNG and a PDF."""
    browser = _Browser(binary or find() or "chromium", width, height)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target,
                                                         "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        browser.send("Page.navigate", {"url": path.resolve().as_uri()}, session)
        browser.wait_event("Page.loadEventFired")
        out = Visit()
        deadline = time.monotonic() + settle_s
        while True:
            out.figures = json.loads(_evaluate(browser, session, FIGURES_JS) or "[]")
            if all(f["drawn"] for f in out.figures) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        out.overflow_px = int(_evaluate(browser, session, OVERFLOW_JS) or 0)
        out.sections = json.loads(_evaluate(browser, session, SECTIONS_JS) or "{}")
        size = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = browser.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}},
            session)
        out.png = base64.b64decode(shot["data"])
        out.pdf = base64.b64decode(browser.send("Page.printToPDF", session=session)["data"])
        out.errors = _errors(browser.events)
        out.requests = [e["params"]["request"]["url"] for e in browser.events
                        if e.get("method") == "Network.requestWillBeSent"
                        and not e["params"]["request"]["url"].startswith(LOCAL)]
        return out
    finally:
        browser.stop()
