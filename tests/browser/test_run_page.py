"""The Run page in headless Chromium (Debian's ``chromium``, driven by Playwright), on a real server with a bearer
token over a real SQLite store holding two train jobs' records (``fill_two_runs`` of
``tests/integration/test_dashboard_run.py``: a resumed run with a skipped update and a pruned checkpoint, and a run
whose output folder is not on this machine). No model is loaded: the page reads only the store.

Pinned: the token box first, then the page; the resolved config; the validation table's before / after rows; the
skipped update's reason and "0 of 4" samples trained; the resume marked between the steps; the pruned checkpoint
said so, with no command; the serve command of a kept checkpoint exactly as the API gives it (with its Copy button);
the best mark; the reward chart; the run picker. A screenshot goes to ``test-artifacts/dashboard/run.png``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.test_dashboard_run import fill_two_runs

from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if importlib.util.find_spec("playwright") is None:
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium; .ci/run does it)", allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-artifacts" / "dashboard"
TOKEN = "run-page-token"


@dataclass
class Served:
    """The running server and the ids the store assigned."""

    url: str = ""
    ids: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def get(self, path: str) -> Any:
        resp = httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        resp.raise_for_status()
        return resp.json()


def _serve(served: Served, folder: Path) -> None:
    """Thread body: fill the store, serve it until ``served.stop`` (Playwright's sync API owns the main thread)."""

    async def main() -> None:
        store = SqliteLightningStore(folder / "store.db")
        try:
            served.ids = await fill_two_runs(store, folder)
            async with serve_in_background(create_app(store, token=TOKEN)) as url:
                served.url = url
                served.ready.set()
                while not served.stop.is_set():
                    await asyncio.sleep(0.05)
        finally:
            await store.close()

    try:
        asyncio.run(main())
    except BaseException as exc:  # reported to the fixture, which fails the test with it
        served.error = exc
        served.ready.set()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served()
    thread = threading.Thread(target=_serve, args=(served, tmp_path_factory.mktemp("run-page")), daemon=True)
    thread.start()
    served.ready.wait(timeout=60)
    if served.error is not None or not served.url:
        served.stop.set()
        raise RuntimeError(f"the server failed: {served.error!r}")
    yield served
    served.stop.set()
    thread.join(timeout=30)


@pytest.fixture
def page(served: Served) -> Iterator[Page]:
    """A tab on the Run page of the first (resumed) run, the token given once through the token box."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(15_000)
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(f"{served.url}/#/run?run={served.ids['run_id']}")
        expect(tab.locator("#auth-message")).to_contain_text("needs a bearer token (401)")
        tab.fill("#auth-token", TOKEN)
        tab.click("#auth button")
        expect(tab.locator("#auth")).to_be_hidden()
        yield tab
        browser.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def test_run_page(page: Page, served: Served) -> None:
    run = served.get(f"/v1/runs/{served.ids['run_id']}")
    expect(page.locator("#nav a.active")).to_have_text("Run")
    expect(page.locator("#run-config")).to_contain_text('"steps": 4')
    expect(page.locator("#run-segments")).to_contain_text("resumed from step 2")
    expect(page.locator("#run-segments")).to_contain_text("settings changed: grpo.steps")

    # validation: before, a mid-run evaluation, after; one column per set
    rows = page.locator("#validation-table tbody tr")
    expect(rows.locator("th")).to_have_text(["before", "step 2", "after"])
    expect(page.locator("#validation-table thead th")).to_contain_text(["calc_x", "gsm_hard", "Mean"])
    expect(rows.first.locator("td")).to_have_text(["0", "25.0%", "0.0%", "12.5%"])

    # steps: the skipped update says why; the resume is marked before step 3
    skipped = page.locator('#steps-table tr[data-step="1"]')
    expect(skipped.locator("td.skipped")).to_have_text("update skipped: all advantages are zero")
    expect(skipped).to_contain_text("0 of 4")
    expect(page.locator('#steps-table tr[data-step="2"]')).to_contain_text("stepped")
    expect(page.locator('#steps-table tr[data-step="2"]')).to_contain_text("3 of 4")
    expect(page.locator('#steps-table tr[data-step="3"] td.skipped')).to_have_text(
        "update skipped: non-finite gradient norm"
    )
    expect(page.locator("#steps-table tr.segment-row")).to_contain_text("resumed from step 2")

    # checkpoints: the pruned one says so and offers no command; a kept one has its commands
    pruned = page.locator('#checkpoints-table tr[data-checkpoint="1"]')
    expect(pruned).to_contain_text("deleted (pruned)")
    expect(pruned.locator("code.command")).to_have_count(0)
    kept = page.locator('#checkpoints-table tr[data-checkpoint="2"]')
    [api_row] = [c for c in run["checkpoints"] if c["train_step"] == 2]
    expect(kept.locator('code[data-command="serve"]')).to_have_text(api_row["serve_command"])
    expect(kept.locator('code[data-command="eval"]')).to_have_text(api_row["eval_command"])
    expect(kept.locator("button.copy")).to_have_count(2)
    expect(kept.locator(".badge.best")).to_have_text("best")
    expect(page.locator(".charts .chart canvas")).to_have_count(1)
    page.screenshot(path=str(SHOTS / "run.png"), full_page=True)

    # the other run, through the picker: its checkpoint is not on this machine
    page.select_option("#run-picker", served.ids["other_id"])
    expect(page.locator('#checkpoints-table tr[data-checkpoint="1"]')).to_contain_text("not on this machine")
    expect(page.locator('#checkpoints-table tr[data-checkpoint="1"] code[data-command="serve"]')).to_contain_text(
        "--model qwen2.5-0.5b"
    )
    expect(page.locator("#validation-table")).to_have_count(0)
