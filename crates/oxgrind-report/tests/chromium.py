#!/usr/bin/python3
"""Opens a report page in Debian's headless Chromium and runs checks in it, for the Rust tests
(tests/page_in_chromium.rs) and for docs/ screenshots.

Drives Chromium through the DevTools protocol over --remote-debugging-pipe (file descriptors 3
and 4, NUL-separated JSON messages): no websocket, no npm package, only the standard library.

    chromium.py PAGE.html STEPS.json   ->  prints {"results": [...], "console_errors": [...]}

STEPS.json is a list of steps, run in order once the page says it is ready
(document.body.dataset.ready == "1"):
    {"eval": "JS expression"}        the value (promises awaited) goes to results
    {"screenshot": "out.png"}        the whole page as PNG (results gets the path)
    {"width": 1280, "height": 900}   the viewport for the following steps
Console errors, uncaught exceptions and failed loads are collected: a page that logs any is
broken, whatever the checks say.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import base64
import fcntl

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--hide-scrollbars",
]


class Browser:
    def __init__(self):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            raise SystemExit("chromium is not installed (scripts/test.sh installs it)")
        self.profile = tempfile.mkdtemp(prefix="oxgrind-chromium-")
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands from fd 3 and writes replies to fd 4. The child's ends are
        # moved above 10 first, so the dup2 calls below cannot overwrite one with the other;
        # subprocess runs preexec_fn before closing other descriptors, and keeps 3 and 4.
        child_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def fds():
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        to_chrome_r, from_chrome_w = child_r, child_w
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            if time.time() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=True, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method, timeout=60):
        deadline = time.time() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise RuntimeError(f"{expression!r} threw: {d.get('exception', {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def console_errors(self):
        errors = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append(d.get("exception", {}).get("description") or d.get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text"))
        return errors


def main():
    page, steps_file = sys.argv[1], sys.argv[2]
    with open(steps_file) as f:
        steps = json.load(f)
    b = Browser()
    try:
        target = b.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        b.session = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            b.call(f"{domain}.enable")
        size = {"width": 1280, "height": 900}
        b.call("Emulation.setDeviceMetricsOverride", {**size, "deviceScaleFactor": 1, "mobile": False})
        b.call("Page.navigate", {"url": "file://" + os.path.abspath(page)})
        b.wait_event("Page.loadEventFired")
        deadline = time.time() + 60
        while b.evaluate("document.body && document.body.dataset.ready") != "1":
            if time.time() > deadline:
                raise TimeoutError("the page never became ready")
            time.sleep(0.05)
        # Two animation frames: views draw in requestAnimationFrame callbacks.
        b.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        results = []
        for step in steps:
            if "eval" in step:
                results.append(b.evaluate(step["eval"]))
            elif "screenshot" in step:
                height = b.evaluate("Math.ceil(document.documentElement.scrollHeight)")
                b.call("Emulation.setDeviceMetricsOverride",
                       {"width": size["width"], "height": min(height, 4000), "deviceScaleFactor": 1, "mobile": False})
                b.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                shot = b.call("Page.captureScreenshot", {"format": "png"})
                with open(step["screenshot"], "wb") as f:
                    f.write(base64.b64decode(shot["data"]))
                b.call("Emulation.setDeviceMetricsOverride", {**size, "deviceScaleFactor": 1, "mobile": False})
                results.append(step["screenshot"])
            elif "width" in step:
                size = {"width": step["width"], "height": step.get("height", 900)}
                b.call("Emulation.setDeviceMetricsOverride", {**size, "deviceScaleFactor": 1, "mobile": False})
                results.append(None)
        json.dump({"results": results, "console_errors": b.console_errors()}, sys.stdout)
        print()
    finally:
        b.close()


if __name__ == "__main__":
    main()
