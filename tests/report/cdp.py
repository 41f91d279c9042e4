"""A small Chrome DevTools Protocol client over --remote-debugging-pipe, standard library only.

Chromium reads NUL-terminated JSON commands from fd 3 and writes replies and events to fd 4.
The browser is started through `bash -c 'exec chromium ... 3<&R 4>&W'` so the two pipe ends land
on exactly those descriptors whatever numbers the parent holds them under.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

# /work/.library/env/machines/cpp.md: no network, no first-run UI, no background services.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--window-size=1300,1800", "--hide-scrollbars",
]


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    def __init__(self, executable, timeout=60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="kvsim-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = " ".join([executable] + CHROMIUM_FLAGS + ["--user-data-dir=" + self.profile, "about:blank"])
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {args} 3<&{to_browser_r} 4>&{from_browser_w}"],
            pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies = {}
        self.events = []
        self._cv = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cv:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cv.notify_all()
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def send(self, method, params=None, session=None):
        with self._cv:
            self._next_id += 1
            mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while mid not in self._replies:
                if self._closed or not self._cv.wait(deadline - time.monotonic()):
                    raise TimeoutError(f"no reply to {method} within {self.timeout} s")
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method, session, since):
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while True:
                for e in self.events[since:]:
                    if e.get("method") == method and e.get("sessionId") == session:
                        return e
                if self._closed or not self._cv.wait(deadline - time.monotonic()):
                    raise TimeoutError(f"no {method} within {self.timeout} s")

    def new_page(self):
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(domain + ".enable", session=session)
        return Page(self, target, session)

    def close(self):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser, target, session):
        self.browser, self.target, self.session = browser, target, session

    def navigate(self, url):
        since = len(self.browser.events)
        self.browser.send("Page.navigate", {"url": url}, session=self.session)
        self.browser.wait_event("Page.loadEventFired", self.session, since)
        self.loaded_at = since

    def errors(self):
        """Script exceptions and console / log errors since the last navigation."""
        found = []
        for e in self.browser.events[self.loaded_at:]:
            if e.get("sessionId") != self.session:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                found.append(p["exceptionDetails"].get("exception", {}).get("description")
                             or p["exceptionDetails"].get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                found.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                found.append("log: " + p["entry"].get("text", ""))
        return found

    def evaluate(self, expression):
        r = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                              session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}...: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path, selector=None):
        """The viewport, or the box of the first element `selector` matches (scrolled into view)."""
        params = {"format": "png"}
        if selector:
            box = self.evaluate(
                "(() => { const e = document.querySelector(%s); const r = e.getBoundingClientRect();"
                " return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}; })()"
                % json.dumps(selector))
            params.update(clip=dict(box, scale=1), captureBeyondViewport=True)
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        self.browser.send("Target.closeTarget", {"targetId": self.target})
