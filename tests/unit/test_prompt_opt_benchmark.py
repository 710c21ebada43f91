"""The pure parts of benchmarks/prompt_opt.py: arm names and overrides, the APO budget fit, the comparison table,
and the gepa adapter's reflective dataset and reflection LM (no model, no store)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from agentbolt.algorithms.apo.types import TaskResult, Trace

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "prompt_opt.py"

TASK = {
    "task_id": "s01",
    "date": "2025-10-13",
    "time": "10:00",
    "duration_min": 30,
    "attendees": 4,
    "needs": ["projector"],
    "accessible_required": False,
    "expected_choice": "Nova",
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prompt_opt_benchmark_under_test", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _summary(**overrides: object) -> dict:
    summary = {
        "algorithm": "apo",
        "model": "smollm2-135m",
        "val_before": 0.25,
        "val_after": 0.5,
        "n_val": 4,
        "test_before": 0.0,
        "test_after": 0.5,
        "n_test": 2,
        "rollouts": {"optimization": 12, "test": 4},
        "optimizer_calls": 3,
        "optimizer_cache_hits": 0,
        "wall_seconds": 41.6,
        "best_prompts": {"prompt_template": "x"},
        "benchmark": {"budget": 12},
    }
    summary.update(overrides)
    return summary


def test_parse_arms_accepts_short_names_keeps_order_and_drops_repeats(bench: ModuleType) -> None:
    assert bench.parse_arms("pypi, apo,agentbolt-apo") == ["gepa-pypi", "agentbolt-apo"]
    assert bench.parse_arms("apo,gepa,gepa-pypi") == list(bench.ARMS)
    with pytest.raises(ValueError, match="unknown arm"):
        bench.parse_arms("apo,dspy")
    with pytest.raises(ValueError, match="no arm"):
        bench.parse_arms(" , ")


def test_arm_overrides_put_user_settings_between_defaults_and_the_arm(bench: ModuleType) -> None:
    out = Path("runs/b/agentbolt-gepa")
    overrides = bench.arm_overrides(
        "agentbolt-gepa", model="m", budget=12, out_dir=out, overwrite=True, user=["gepa.max_iterations=3"]
    )
    assert overrides.index("gepa.max_rollouts=12") < overrides.index("gepa.max_iterations=3")
    assert not any(item.startswith("gepa.max_iterations=") for item in overrides[:-5])  # the config's cap stays
    assert overrides[-4:] == ["algorithm=gepa", "model=m", f"out_dir={out}", "overwrite=true"]
    assert f"optimizer.cache_dir={out / 'optimizer_cache'}" in overrides
    apo = bench.arm_overrides("agentbolt-apo", model="m", budget=12, out_dir=out, overwrite=False, user=[])
    assert "algorithm=apo" in apo and not any(item.startswith("gepa.") for item in apo)
    assert "algorithm=gepa" in bench.arm_overrides(
        "gepa-pypi", model="m", budget=1, out_dir=out, overwrite=False, user=[]
    )


def test_arm_config_reads_the_room_config_with_overrides(bench: ModuleType, tmp_path: Path) -> None:
    options = bench.BenchOptions(
        arms=["agentbolt-gepa"],
        budget=20,
        model="smollm2-135m",
        out=tmp_path,
        config=Path(__file__).resolve().parents[2] / "examples" / "room_agent" / "config.yaml",
        overrides=["val_size=4"],
    )
    config, tasks = bench.arm_config("agentbolt-gepa", options)
    assert (config.algorithm, config.model, config.val_size) == ("gepa", "smollm2-135m", 4)
    assert (config.gepa.max_rollouts, config.gepa.max_iterations) == (20, 24)
    assert config.out_dir == tmp_path / "agentbolt-gepa"
    assert tasks == config.tasks == "examples.room_agent.tasks"

    fitted = bench.BenchOptions(**{**vars(options), "budget": 100, "test_size": 3, "fit_apo_rounds": True})
    apo, tasks = bench.arm_config("agentbolt-apo", fitted)
    assert apo.apo.rounds == 6  # val 4, beam 1, batch 6: 4 + 6 * (6 + 2 * 4) = 88 <= 100 < 102 (7 rounds)
    assert tasks == "examples.room_agent.tasks" != apo.tasks
    shim = sys.modules[apo.tasks]
    assert [len(shim.load_test_tasks()), len(shim.load_train_tasks(size=2))] == [3, 2]


def test_apo_rounds_fit_the_budget(bench: ModuleType) -> None:
    sizes = {"beam_width": 2, "branch_factor": 2, "train_batch_size": 8, "n_train": 19, "n_val": 19}
    # seed val 19; round 1: 1 member -> 8 + 2 * 19 = 46; later rounds: 2 members -> 16 + 4 * 19 = 92
    assert bench.apo_rollout_bound(1, **sizes) == 19 + 46
    assert bench.apo_rollout_bound(2, **sizes) == 19 + 46 + 92
    assert bench.apo_rounds_for_budget(160, **sizes) == 2
    assert bench.apo_rounds_for_budget(156, **sizes) == 1
    assert bench.apo_rounds_for_budget(1, **sizes) == 1  # never fewer than one round


def test_table_from_hand_made_summaries(bench: ModuleType, tmp_path: Path) -> None:
    summaries = {
        "agentbolt-apo": _summary(optimizer_cache_hits=1),
        "gepa-pypi": _summary(algorithm="gepa-pypi", test_before=None, test_after=None, n_test=0, wall_seconds=None),
    }
    table = bench.markdown_table(summaries, title=bench.table_title(summaries))
    lines = table.splitlines()
    assert lines[0] == "Prompt optimization, room agent: model smollm2-135m, rollout budget 12"
    with_optimizer = {arm: {**summary, "optimizer_model": "qwen2.5-coder-1.5b"} for arm, summary in summaries.items()}
    assert bench.table_title(with_optimizer) == (
        "Prompt optimization, room agent: model smollm2-135m, optimizer qwen2.5-coder-1.5b, rollout budget 12"
    )
    header = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert header == list(bench.TABLE_COLUMNS)
    assert set(lines[3]) <= {"|", "-"}
    apo = [cell.strip() for cell in lines[4].strip("|").split("|")]
    assert apo == ["agentbolt-apo", "0.250 -> 0.500 (n=4)", "0.000 -> 0.500 (n=2)", "12 + 4", "3 (1 cached)", "42"]
    pypi = [cell.strip() for cell in lines[5].strip("|").split("|")]
    assert pypi == ["gepa-pypi", "0.250 -> 0.500 (n=4)", "-", "12 + 4", "3", "-"]
    assert len({len(line) for line in lines[2:]}) == 1  # the columns line up

    for arm, summary in summaries.items():
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "summary.json").write_text(json.dumps(summary))
    assert bench.write_table(tmp_path, ["agentbolt-apo", "agentbolt-gepa", "gepa-pypi"]) == table
    assert (tmp_path / "table.md").read_text() == table
    assert bench.write_table(tmp_path / "empty", ["agentbolt-apo"]) == ""


def test_reflective_dataset_from_hand_made_task_results(bench: ModuleType) -> None:
    messages = [
        {"role": "user", "content": "Book a room on 2025-10-13"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "get_rooms_and_availability", "arguments": '{"date": "x"}'}}],
        },
        {"role": "tool", "content": "[{...}]"},
        {"role": "assistant", "content": "Answer: Lyra"},
    ]
    wrong = TaskResult(
        "s01",
        0.0,
        Trace(messages, answer="Lyra", feedback="Wrong: the expected choice was Nova, the agent answered Lyra."),
        "ro-1",
    )
    untraced = TaskResult("s02", 1.0, None, "ro-2")
    adapter = bench.StoreGEPAAdapter(
        publisher=None, evaluator=None, loop=None, train_task_ids={"s01"}, seed_prompts={"prompt_template": "x"}
    )
    batch = SimpleNamespace(
        trajectories=[bench.RolloutRecord(TASK, wrong), bench.RolloutRecord({**TASK, "task_id": "s02"}, untraced)]
    )
    dataset = adapter.make_reflective_dataset({"prompt_template": "x", "other": "y"}, batch, ["prompt_template"])
    assert list(dataset) == ["prompt_template"]
    first, second = dataset["prompt_template"]
    assert first["Inputs"] == {key: TASK[key] for key in TASK if key not in ("task_id", "expected_choice")}
    assert first["Generated Outputs"].splitlines() == [
        "[user] Book a room on 2025-10-13",
        '[assistant] calls get_rooms_and_availability({"date": "x"})',
        "[tool] [{...}]",
        "[assistant] Answer: Lyra",
        "Parsed answer: Lyra",
    ]
    assert first["Feedback"] == "Wrong: the expected choice was Nova, the agent answered Lyra."
    assert second["Generated Outputs"] == "(no trace recorded)"
    assert second["Feedback"] == "reward 1.00 (no feedback recorded)"
    json.dumps(dataset)  # gepa needs it JSON-serializable

    long = TaskResult("s03", 0.0, Trace([{"role": "assistant", "content": "z" * 5000}], answer=None), None)
    text = bench.render_conversation(long, max_message_chars=100, max_chars=3000)
    assert text.startswith("[assistant] zzz") and len(text.splitlines()[0]) == 100
    assert text.endswith("Parsed answer: (none)")
    assert len(bench.render_conversation(long, max_message_chars=5000, max_chars=120)) == 120


def test_adapter_needs_a_loop_to_evaluate_and_tracks_gepa_iterations(bench: ModuleType) -> None:
    class Publisher:
        async def publish(self, prompts: dict, **kwargs: object) -> None:
            raise AssertionError("never run without a loop")

    adapter = bench.StoreGEPAAdapter(
        publisher=Publisher(), evaluator=None, loop=None, train_task_ids=set(), seed_prompts={"prompt_template": "x"}
    )
    assert adapter.propose_new_texts is None  # gepa reads it directly
    adapter.on_iteration_start({"iteration": 3})
    assert adapter.iteration == 3
    with pytest.raises(RuntimeError, match="event loop"):
        adapter.candidate_for({"prompt_template": "x"})
    assert bench.candidate_key({"b": "1", "a": "2"}) == bench.candidate_key({"a": "2", "b": "1"})


def test_reflection_lm_sends_one_user_message_with_the_optimizer_sampling(bench: ModuleType) -> None:
    sent: list[dict] = []

    def create(**kwargs: object) -> SimpleNamespace:
        sent.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="```new```"))])

    lm = bench.ReflectionLM(create, model="m", temperature=0.7, max_tokens=128)
    assert lm("improve this") == "```new```"
    assert lm([{"role": "user", "content": "again"}]) == "```new```"
    assert lm.calls == 2
    assert sent[0] == {
        "model": "m",
        "messages": [{"role": "user", "content": "improve this"}],
        "temperature": 0.7,
        "max_tokens": 128,
    }
    assert sent[1]["messages"] == [{"role": "user", "content": "again"}]
