"""What TensorBoard shows of some runs: screenshots of its dashboards in headless Chromium, and the HParams columns.

    .venv/bin/python benchmarks/tensorboard_view.py LOGDIR [--out DIR] [--pages timeseries,custom_scalars,hparams]

Starts ``tensorboard --logdir LOGDIR`` on a free local port, asks its HParams plugin for the experiment (the
columns in the order TensorBoard shows them, with each column's ``differs`` flag), and screenshots each page with
Debian's Chromium (``apt-get install chromium``), headless, without sandbox or background networking, drawing
WebGL on the CPU (SwiftShader). Writes ``OUT/<page>.png`` and ``OUT/hparams.json``; look at the PNGs.
Not part of ``make test``: it needs Chromium, and what it checks is what a person sees (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# the machine notes' flags, but WebGL on SwiftShader (CPU) instead of --disable-gpu: TensorBoard draws its line
# charts with WebGL, and with --disable-gpu they come out as empty axes
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
                  "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--hide-scrollbars")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tensorboard(logdir: Path, port: int) -> subprocess.Popen:
    tb = Path(sys.executable).with_name("tensorboard")
    proc = subprocess.Popen([str(tb), "--logdir", str(logdir), "--port", str(port), "--host", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited: {proc.stderr.read()[-2000:]}") from None
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("tensorboard did not answer in 60 s")


def hparams_experiment(port: int) -> dict:
    """The experiment TensorBoard's HParams dashboard shows: its columns in order, each with ``differs``."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/experiment",
                                 data=json.dumps({"experimentName": ""}).encode(),
                                 headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())


def screenshot(url: str, out: Path, size: str, wait_s: float) -> None:
    """Open ``url`` in headless Chromium, wait ``wait_s`` real seconds (TensorBoard draws its charts in a worker,
    which Chromium's --screenshot with virtual time captures half drawn), and save the window as a PNG, through the
    DevTools protocol (aiohttp's websocket client, which Ray brings)."""
    import asyncio
    import base64

    import aiohttp

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("no chromium on PATH (apt-get install chromium)")
    port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
                                    f"--remote-debugging-port={port}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async def capture() -> bytes:
                async with aiohttp.ClientSession() as http:
                    for _ in range(60):
                        try:
                            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                                pages = [t for t in await r.json() if t["type"] == "page"]
                            if pages:
                                break
                        except aiohttp.ClientError:
                            pass
                        await asyncio.sleep(0.5)
                    async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                        ids = iter(range(1, 1000))

                        async def call(method: str, **params: object) -> dict:
                            n = next(ids)
                            await ws.send_json({"id": n, "method": method, "params": params})
                            async for msg in ws:
                                data = msg.json()
                                if data.get("id") == n:
                                    return data.get("result", {})
                            raise RuntimeError(f"Chromium closed the connection during {method}")

                        await call("Page.navigate", url=url)
                        await asyncio.sleep(wait_s)
                        shot = await call("Page.captureScreenshot", format="png")
                        return base64.b64decode(shot["data"])

            out.write_bytes(asyncio.run(capture()))
        finally:
            browser.terminate()
            browser.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tensorboard-view"))
    parser.add_argument("--pages", default="timeseries,custom_scalars,hparams")
    parser.add_argument("--size", default="1400,1000", help="the window, in pixels (width,height)")
    parser.add_argument("--wait-s", type=float, default=10.0, help="seconds each page gets to load and draw")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start_tensorboard(args.logdir, port)
    try:
        experiment = hparams_experiment(port)
        (args.out / "hparams.json").write_text(json.dumps(experiment, indent=1))
        columns = [(h["name"], h.get("differs", False)) for h in experiment.get("hparamInfos", [])]
        print(f"HParams: {len(columns)} columns; the first 8: "
              + ", ".join(f"{n}{' (differs)' if d else ''}" for n, d in columns[:8]))
        for page in filter(None, args.pages.split(",")):
            png = args.out / f"{page}.png"
            screenshot(f"http://127.0.0.1:{port}/#{page}", png.resolve(), args.size, args.wait_s)
            print(f"{page}: {png}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
