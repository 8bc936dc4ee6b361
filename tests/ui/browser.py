"""A headless Chromium driven over the Chrome DevTools Protocol, with nothing but the `websockets` package.

Enough of CDP for a page test: open a page, evaluate JavaScript, wait for a condition, type with real key events
(`Input.dispatchKeyEvent`: keydown, the text, input events, keyup, as a keyboard makes them), click, take a
screenshot, and collect what the page reported as errors (uncaught exceptions, `console.error`, and the browser's
own log: failed loads, CSP violations). The browser is Debian's `chromium` package (scripts/ensure-chromium.sh),
started in its own process group with a throwaway profile and stopped by its pid.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import websockets

from sessiongate.benchmarks.processes import ManagedProcess

__all__ = ["Page", "find_chromium", "open_page"]

_BINARIES = ("chromium", "chromium-browser")
_KEY_CODES = {"Enter": 13, "Backspace": 8}


def find_chromium() -> str | None:
    for name in _BINARIES:
        if path := shutil.which(name):
            return path
    return None


class PageError(AssertionError):
    """The page raised, or a condition never came true."""


class Page:
    def __init__(self, connection: websockets.ClientConnection) -> None:
        self.connection = connection
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.errors: list[str] = []
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.connection:
            message = json.loads(raw)
            if "id" in message:
                future = self.pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            else:
                self._event(message["method"], message.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(f"exception: {details.get('exception', {}).get('description') or details['text']}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            words = (str(a.get("value", a.get("description"))) for a in params["args"])
            self.errors.append("console.error: " + " ".join(words))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry['text']} {entry.get('url', '')}".strip())

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[number] = future
        await self.connection.send(json.dumps({"id": number, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, 60)
        if "error" in answer:
            raise PageError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise); a thrown error fails the test."""
        answer = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise PageError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, what: str, timeout_s: float = 30.0) -> Any:
        """Poll `expression` until it is truthy (returned), or fail saying `what` never happened."""
        deadline = time.monotonic() + timeout_s
        while not (value := await self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise PageError(f"{what}: not within {timeout_s} s; page errors: {self.errors}")
            await asyncio.sleep(0.1)
        return value

    async def click(self, selector: str) -> None:
        box = await self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1)

    async def type_text(self, text: str, delay_s: float = 0.02) -> None:
        """Type into the focused element one key at a time, as a keyboard would."""
        for char in text:
            await self.send("Input.dispatchKeyEvent", type="keyDown", key=char, text=char, unmodifiedText=char)
            await self.send("Input.dispatchKeyEvent", type="keyUp", key=char)
            await asyncio.sleep(delay_s)

    async def press(self, key: str) -> None:
        """A key that types no text: `Enter`, `Backspace`."""
        code = _KEY_CODES[key]
        event = {"key": key, "code": key, "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}
        await self.send("Input.dispatchKeyEvent", type="rawKeyDown", **event)
        await self.send("Input.dispatchKeyEvent", type="keyUp", **event)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _debugging_port(profile: Path, browser: ManagedProcess, timeout_s: float) -> int:
    """The port Chromium chose (`--remote-debugging-port=0`): the first line of DevToolsActivePort."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if browser.process.poll() is not None:
            raise RuntimeError(f"chromium exited with {browser.process.returncode}:\n{browser.log_tail()}")
        if marker.exists() and (lines := marker.read_text().splitlines()):
            return int(lines[0])
        time.sleep(0.1)
    raise TimeoutError(f"chromium opened no DevTools port in {timeout_s} s:\n{browser.log_tail()}")


@contextlib.asynccontextmanager
async def open_page(binary: str, workdir: Path, *, width: int = 1400, height: int = 900) -> AsyncIterator[Page]:
    """A fresh headless Chromium (its own profile under `workdir`) and its one page, connected over CDP."""
    profile = workdir / "chromium-profile"
    command = [
        binary,
        "--headless",
        "--no-sandbox",  # the tests may run as root (CI), where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    browser = ManagedProcess(command, log_path=workdir / "chromium.log")
    try:
        port = await asyncio.to_thread(_debugging_port, profile, browser, 60.0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            targets = (await http.get("/json/list")).json()
        target = next(t for t in targets if t["type"] == "page")
        async with websockets.connect(target["webSocketDebuggerUrl"], max_size=None) as connection:
            page = Page(connection)
            try:
                for domain in ("Page", "Runtime", "Log"):
                    await page.send(f"{domain}.enable")
                yield page
            finally:
                page.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await page.reader
    finally:
        await asyncio.to_thread(browser.stop)
