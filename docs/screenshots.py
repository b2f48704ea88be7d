"""Screenshots of a running `make airflow` with headless Chromium (how docs/*.png were made).

    python docs/screenshots.py OUT.png /plugin/mirrors [--wait 8]

Logs in as `admin` with the password `airflow standalone` generated (a token from `/auth/token`, set as
the UI's `_token` cookie), opens the page in Chromium through the DevTools protocol and saves a PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSWORDS = ROOT / ".state" / "airflow" / "simple_auth_manager_passwords.json.generated"


def token(base: str) -> str:
    password = json.loads(PASSWORDS.read_text())["admin"]
    req = urllib.request.Request(f"{base}/auth/token", data=json.dumps({"username": "admin", "password": password})
                                 .encode(), headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["access_token"]


async def shoot(ws_url: str, base: str, path: str, jwt: str, out: Path, wait: float) -> None:
    import websockets

    async with websockets.connect(ws_url, max_size=64 * 1024 * 1024, ping_interval=None) as ws:
        n = 0

        async def call(method: str, **params: object) -> dict:
            nonlocal n
            n += 1
            await ws.send(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("id") == n:
                    return msg.get("result", {})

        await call("Network.enable")
        await call("Network.setCookie", name="_token", value=jwt, url=base, path="/")
        await call("Page.enable")
        await call("Page.navigate", url=f"{base}{path}")
        await asyncio.sleep(wait)  # the UI's scripts fetch their data after load
        shot = await call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("path")
    ap.add_argument("--base", default="http://localhost:8080")
    ap.add_argument("--wait", type=float, default=8.0)
    ap.add_argument("--size", default="1440,1000")
    args = ap.parse_args()
    jwt = token(args.base)
    port = 9333
    with tempfile.TemporaryDirectory() as profile:
        chrome = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                                   f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                                   f"--window-size={args.size}", "about:blank"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2) as r:
                        pages = [p for p in json.loads(r.read()) if p.get("type") == "page"]
                    if pages:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("chromium did not start")
                time.sleep(0.3)
            asyncio.run(shoot(pages[0]["webSocketDebuggerUrl"], args.base, args.path, jwt, args.out, args.wait))
        finally:
            chrome.terminate()
            chrome.wait(10)
    print(args.out)


if __name__ == "__main__":
    main()
