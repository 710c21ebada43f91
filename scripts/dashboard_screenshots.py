"""Screenshots of every dashboard page over a real store (``python scripts/dashboard_screenshots.py``).

The store file (default ``runs/demo/store.db``, written by ``agentbolt demo``) is copied to a temporary folder first,
so the original is never opened for writing; the server (``agentbolt serve`` without a model: token texts are not
shown) runs in this process on a free loopback port; each page is opened in headless Chromium through Playwright
(the system ``chromium`` on PATH, as in ``tests/browser``; ``scripts/ensure_chromium.sh`` installs it) and saved as
``OUT/<page>.png`` (default ``docs/dashboard/``). Pages: rollouts, one rollout (the best-rewarded succeeded train
rollout, so its tokens show advantages), its trace and tokens, resources (the first and the last version diffed),
runners, errors, training, run.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import httpx

from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store import SqliteLightningStore

SETTLE_MS = 600
"""Wait after the network is idle, so charts finish drawing (milliseconds)."""


class Server:
    """The agentbolt server over one SQLite file, on its own event loop in a background thread."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        store = SqliteLightningStore(self.db)
        try:
            async with serve_in_background(create_app(store)) as url:
                self.url = url
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise
        finally:
            await store.close()

    def __enter__(self) -> Server:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None or not self.url:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def routes(url: str) -> dict[str, str]:
    """Page name -> hash route, with a rollout and two resources versions picked from the store."""
    with httpx.Client(base_url=url, timeout=60) as client:
        found = client.get(
            "/v1/rollouts/search",
            params={
                "status": "succeeded",
                "mode": "train",
                "sort_by": "final_reward",
                "descending": "true",
                "limit": 1,
            },
        ).json()["items"]
        if not found:
            found = client.get("/v1/rollouts/search", params={"limit": 1}).json()["items"]
        versions = [r["resources_id"] for r in client.get("/v1/resources").json()]
    out = {"rollouts": "#/rollouts"}
    if found:
        rollout_id = found[0]["rollout_id"]
        out |= {
            "rollout": f"#/rollouts/{rollout_id}",
            "trace": f"#/rollouts/{rollout_id}/trace",
            "tokens": f"#/rollouts/{rollout_id}/tokens?t=0",
        }
    out["resources"] = f"#/resources?a={versions[0]}&b={versions[-1]}" if len(versions) > 1 else "#/resources"
    out |= {"runners": "#/runners", "errors": "#/errors", "training": "#/training", "run": "#/run"}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, default=Path("runs/demo/store.db"), help="SQLite store file (copied)")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard"), help="folder for the PNG files")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium on PATH (Debian: apt-get install -y chromium; scripts/ensure_chromium.sh)", file=sys.stderr)
        return 2
    if not args.store.is_file():
        print(f"no store file at {args.store}; run agentbolt demo first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        for suffix in ("", "-wal"):  # the WAL holds committed writes not yet checkpointed
            source = Path(f"{args.store}{suffix}")
            if source.exists():
                shutil.copyfile(source, Path(f"{db}{suffix}"))
        with Server(db) as server, sync_playwright() as p:
            pages = routes(server.url)
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": args.width, "height": args.height})
            context.set_default_timeout(30_000)
            tab = context.new_page()
            errors: list[str] = []
            tab.on("pageerror", lambda exc: errors.append(str(exc)))
            for name, route in pages.items():
                tab.goto("about:blank")  # a full load per page: a hash-only change may not have re-rendered yet
                tab.goto(f"{server.url}/{route}")
                tab.wait_for_load_state("networkidle")
                tab.wait_for_timeout(SETTLE_MS)
                path = args.out / f"{name}.png"
                tab.screenshot(path=str(path), full_page=True)
                print(f"{name:10s} {route:60s} -> {path}")
            browser.close()
    if errors:
        print(f"JavaScript errors on the pages: {errors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
