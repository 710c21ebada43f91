"""The Run page's API (``GET /v1/runs``, ``GET /v1/runs/{run_id}``) over a real SQLite store and a real server.

The store is filled through the store API with the records ``agentbolt train`` writes (the same metadata keys and
metric names; compare a real store: ``agentbolt train CONFIG --out OUT`` then ``OUT/store.db``): a run that skips
its first update (every advantage 0), trains at step 2, is resumed from step 2 with one setting changed, has a step
whose gradient norm was not finite, a mid-run evaluation and a final one; its step-1 checkpoint was pruned (the
folder is gone, its ``checkpoints`` folder is not); a second run in the same store whose output folder is not on
this machine. Checkpoint folders live under a path with a space, so the commands must be shell-quoted.

Pinned: the runs and their ids; the resolved config of the latest segment and the keys the resume changed; the
validation table (before / step 2 / after rows, one column per set); per-step rows (reward, samples trained, the
skip reasons); each checkpoint's state, best mark and commands (split back with ``shlex`` into the exact argv);
metrics of the second run never leak into the first; 404 for an unknown run.
"""

from __future__ import annotations

import asyncio
import copy
import shlex
import time
from pathlib import Path
from typing import Any

import httpx

from agentbolt.server import dashboard_run
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store import SqliteLightningStore
from agentbolt.types import LLM, Metric

MODEL = "smollm2-135m"
SETS = ("calc_x", "gsm_hard")
CONFIG: dict[str, Any] = {
    "algorithm": "lightningrl",
    "model": MODEL,
    "grpo": {"steps": 3, "group_size": 2, "advantage_estimator": "grpo"},
    "checkpoint": {"every": 1, "keep_last": 2, "keep_best": True},
    "torch_trainer": {},
    "resume": False,
    "overwrite": True,
}
LLM_RESOURCE = LLM(endpoint="http://127.0.0.1:1/v1", model="smollm2")


def _update_stats(*, stepped: bool, trained: int, zero: int, loss: float | None = None) -> dict[str, float]:
    """The ``update_*`` metrics of a step, as the torch trainer reports them (non-finite values are not recorded)."""
    stats = {
        "update_stepped": 1.0 if stepped else 0.0,
        "update_n_samples": float(trained),
        "update_n_skipped_zero_advantage": float(zero),
        "update_n_skipped_no_loss_tokens": 0.0,
        "update_loss": 0.0 if loss is None else loss,
    }
    if stepped:
        stats |= {"update_approx_kl": 0.002, "update_grad_norm": 0.75, "update_clip_fraction": 0.0}
    return stats


class JobWriter:
    """Writes what one train job records, in the order it records it."""

    def __init__(self, store: SqliteLightningStore, out_dir: Path) -> None:
        self.store = store
        self.out_dir = out_dir
        self.checkpoints = out_dir / "checkpoints"

    async def start(self, config: dict[str, Any], resumed_from_step: int | None) -> str:
        update = await self.store.add_resources(
            {},
            metadata={
                "purpose": dashboard_run.RUN_PURPOSE,
                "config": config,
                "out_dir": str(self.out_dir),
                "resumed_from_step": resumed_from_step,
            },
        )
        return update.resources_id

    async def step(self, train_step: int, reward: float, stats: dict[str, float]) -> None:
        values = {
            "train_reward_mean": reward,
            "train_reward_std": 0.5,
            "rollout_s": 2.0,
            "update_s": 0.25,
            "wait_s": 2.0,
            "n_rollouts": 4.0,
            "n_failed_rollouts": 1.0,
            "n_infra_failed_rollouts": 0.0,
            "n_samples": 4.0,
            "n_transitions": 4.0,
            **stats,
        }
        now = time.time()
        await self.store.add_metrics(
            [Metric(name=k, train_step=train_step, value=v, time=now) for k, v in values.items()]
        )

    async def checkpoint(self, train_step: int, *, on_disk: bool = True) -> str:
        path = self.checkpoints / f"step-{train_step}"
        if on_disk:
            path.mkdir(parents=True)
        await self.store.add_resources(
            {"llm": LLM_RESOURCE},
            metadata={
                "purpose": "checkpoint",
                "train_step": train_step,
                "model_version": f"step-{train_step}",
                "checkpoint": str(path),
            },
        )
        return str(path)

    async def evaluate(self, purpose: str, train_step: int, accuracy: tuple[float, float]) -> None:
        version = "base" if train_step == 0 else f"step-{train_step}"
        metadata: dict[str, Any] = {"model_version": version, "purpose": purpose}
        if train_step:
            metadata["checkpoint"] = str(self.checkpoints / f"step-{train_step}")
        await self.store.add_resources({"llm": LLM_RESOURCE}, metadata=metadata)
        now = time.time()
        await self.store.add_metrics(
            [
                Metric(name=f"val_accuracy/{name}", train_step=train_step, value=v, time=now)
                for name, v in zip(SETS, accuracy, strict=True)
            ]
        )


async def fill_two_runs(store: SqliteLightningStore, tmp_path: Path) -> dict[str, Any]:
    """The two runs (see the module docstring); returns their ids and checkpoint paths."""
    job = JobWriter(store, tmp_path / "my run")
    run_id = await job.start(CONFIG, None)
    await job.evaluate("before", 0, (0.25, 0.0))
    await store.add_resources({"llm": LLM_RESOURCE}, metadata={"model_version": "base", "purpose": "train"})
    await job.step(1, 0.0, _update_stats(stepped=False, trained=0, zero=4))  # every advantage 0: skipped
    step1 = await job.checkpoint(1, on_disk=False)  # pruned later (keep_last 2, not the best)
    await job.step(2, 0.5, _update_stats(stepped=True, trained=3, zero=1, loss=0.125))
    await job.evaluate("step-2", 2, (0.5, 0.25))
    step2 = await job.checkpoint(2)
    job.checkpoints.mkdir(parents=True, exist_ok=True)
    # step 3 ran and was checkpointed, then the user deleted step-3 and resumed from step 2: step 3 runs again
    await job.step(3, 0.125, _update_stats(stepped=True, trained=4, zero=0, loss=0.5))
    await job.checkpoint(3, on_disk=False)

    resumed = copy.deepcopy(CONFIG)
    resumed["grpo"]["steps"] = 4
    resumed["torch_trainer"] = {"kl_coef": 0.1}  # a section set on one side only: one key
    resumed["resume"], resumed["overwrite"] = True, False
    resume_id = await job.start(resumed, 2)
    await job.step(3, 0.75, _update_stats(stepped=False, trained=2, zero=0, loss=0.5))  # inf grad norm
    step3 = await job.checkpoint(3)
    await job.step(4, 1.0, _update_stats(stepped=True, trained=4, zero=0, loss=0.25))
    step4 = await job.checkpoint(4)
    await job.evaluate("after", 4, (0.5, 0.0))

    other = JobWriter(store, Path("/nonexistent-agentbolt-run") / "out")
    other_id = await other.start({**CONFIG, "model": "qwen2.5-0.5b"}, None)
    await other.step(1, 0.25, _update_stats(stepped=True, trained=4, zero=0, loss=0.5))
    other_ckpt = await other.checkpoint(1, on_disk=False)
    return {
        "run_id": run_id,
        "resume_id": resume_id,
        "other_id": other_id,
        "paths": {1: step1, 2: step2, 3: step3, 4: step4},
        "other_ckpt": other_ckpt,
    }


def test_run_view_of_a_resumed_run_with_skipped_updates_and_pruned_checkpoints(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            ids = await fill_two_runs(store, tmp_path)
            async with serve_in_background(create_app(store)) as url, httpx.AsyncClient(base_url=url) as client:
                runs = (await client.get("/v1/runs")).json()
                assert [(r["run_id"], r["model"], r["n_segments"], r["last_train_step"]) for r in runs] == [
                    (ids["run_id"], MODEL, 2, 4),
                    (ids["other_id"], "qwen2.5-0.5b", 1, 1),
                ]
                resp = await client.get("/v1/runs/nope")
                assert resp.status_code == 404 and "GET /v1/runs" in resp.text
                assert (await client.get(f"/v1/runs/{ids['resume_id']}")).status_code == 404  # a resume is no run

                run = (await client.get(f"/v1/runs/{ids['run_id']}")).json()
                assert run["out_dir"] == str(tmp_path / "my run")
                assert run["config"]["grpo"]["steps"] == 4 and run["config"]["resume"] is True  # the latest segment
                assert [(s["resources_id"], s["resumed_from_step"], s["changed"]) for s in run["segments"]] == [
                    (ids["run_id"], None, []),
                    (ids["resume_id"], 2, ["grpo.steps", "torch_trainer"]),  # resume / overwrite are not settings
                ]

                validation = run["validation"]
                assert validation["sets"] == list(SETS)
                rows = [(r["label"], r["train_step"], r["accuracy"], r["mean_accuracy"]) for r in validation["rows"]]
                assert rows == [
                    ("before", 0, {"calc_x": 0.25, "gsm_hard": 0.0}, 0.125),
                    ("step 2", 2, {"calc_x": 0.5, "gsm_hard": 0.25}, 0.375),
                    ("after", 4, {"calc_x": 0.5, "gsm_hard": 0.0}, 0.25),
                ]
                assert validation["rows"][0]["model_version"] == "base"
                assert validation["rows"][-1]["checkpoint"] == ids["paths"][4]

                steps = {s["train_step"]: s for s in run["steps"]}
                assert sorted(steps) == [1, 2, 3, 4]  # the second run's step 1 is not this run's
                assert steps[1]["reward_mean"] == 0.0 and steps[1]["stepped"] is False
                assert steps[1]["skipped_reason"] == dashboard_run.ALL_ZERO_ADVANTAGE
                assert (steps[1]["trained_samples"], steps[1]["n_samples"], steps[1]["n_skipped_zero_advantage"]) == (
                    0,
                    4,
                    4,
                )
                assert steps[2]["stepped"] is True and steps[2]["skipped_reason"] is None
                assert (steps[2]["trained_samples"], steps[2]["loss"], steps[2]["grad_norm"]) == (3, 0.125, 0.75)
                assert steps[3]["skipped_reason"] == "update skipped: non-finite gradient norm"
                assert steps[3]["grad_norm"] is None
                assert [steps[k]["segment"] for k in (1, 2, 3, 4)] == [0, 0, 1, 1]
                assert steps[1]["n_failed_rollouts"] == 1 and steps[1]["rollout_s"] == 2.0

                checkpoints = {c["train_step"]: c for c in run["checkpoints"]}
                assert sorted(checkpoints) == [1, 2, 3, 4]
                assert (checkpoints[1]["state"], checkpoints[1]["state_label"]) == ("pruned", "deleted (pruned)")
                assert checkpoints[2]["state"] == checkpoints[4]["state"] == "on_disk"
                assert [checkpoints[k]["mean_accuracy"] for k in (1, 2, 3, 4)] == [None, 0.375, None, 0.25]
                assert [k for k, c in checkpoints.items() if c["best"]] == [2]
                # step 3 trained twice: the second (resumed) run's figures and checkpoint version are the ones shown
                assert steps[3]["reward_mean"] == 0.75 and checkpoints[3]["path"] == ids["paths"][3]
                versions = {u.resources_id: u for u in await store.query_resources()}
                assert versions[checkpoints[3]["resources_id"]].create_time > versions[run["run_id"]].create_time
                assert [
                    u.resources_id
                    for u in versions.values()
                    if u.metadata.get("checkpoint") == ids["paths"][3] and u.metadata.get("purpose") == "checkpoint"
                ][-1] == checkpoints[3]["resources_id"]
                path = ids["paths"][2]
                assert shlex.split(checkpoints[2]["serve_command"]) == [
                    "agentbolt", "serve", "--model", MODEL, "--adapter", path,
                ]  # fmt: skip
                assert shlex.split(checkpoints[2]["eval_command"]) == [
                    "agentbolt", "eval", f"{path}/config.yaml", "--checkpoint", path,
                ]  # fmt: skip

                other = (await client.get(f"/v1/runs/{ids['other_id']}")).json()
                assert [s["train_step"] for s in other["steps"]] == [1] and other["validation"]["rows"] == []
                [ckpt] = other["checkpoints"]
                assert (ckpt["state"], ckpt["state_label"]) == ("not_on_this_machine", "not on this machine")
                assert ckpt["serve_command"].startswith("agentbolt serve --model qwen2.5-0.5b --adapter ")
        finally:
            await store.close()

    asyncio.run(main())


def test_an_empty_store_has_no_run(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            await store.add_metrics([Metric(name="train_reward_mean", train_step=1, value=0.5, time=time.time())])
            async with serve_in_background(create_app(store)) as url, httpx.AsyncClient(base_url=url) as client:
                assert (await client.get("/v1/runs")).json() == []
        finally:
            await store.close()

    asyncio.run(main())


def test_skip_reasons() -> None:
    reason = dashboard_run.update_skip_reason
    assert reason({"update_stepped": 1.0, "update_n_skipped_zero_advantage": 2.0}) is None  # partly skipped: stepped
    assert reason({}) is None  # nothing recorded (another backend)
    base = {"update_stepped": 0.0, "update_n_samples": 0.0}
    assert reason({**base, "update_n_skipped_zero_advantage": 3.0}) == "update skipped: all advantages are zero"
    assert "no sample has tokens to train" in str(reason({**base, "update_n_skipped_no_loss_tokens": 2.0}))
    assert (
        reason({**base, "update_n_skipped_zero_advantage": 1.0, "update_n_skipped_no_loss_tokens": 2.0})
        == "update skipped: 1 samples with advantage 0, 2 with no tokens to train"
    )
    assert "update skipped: no training sample" in str(reason(base))


def test_constants_match_the_trainer() -> None:
    """The server reads what the trainer writes without importing it: the names must stay equal."""
    from agentbolt.trainer import checkpoint, job_config

    assert dashboard_run.RUN_PURPOSE == job_config.RUN_PURPOSE
    assert dashboard_run.CONFIG_FILE == checkpoint.CONFIG_FILE
