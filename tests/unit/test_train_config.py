"""``agentbolt train CONFIG.yaml``: the shipped calc config loads, overrides apply, bad input fails with one clear line
before anything is written; ``agentbolt plot`` draws several runs' curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentbolt.cli.main import app
from agentbolt.errors import ConfigError
from agentbolt.trainer.job_config import TrainConfig, load_tasks_module, load_test_tasks, load_train_config

REPO = Path(__file__).resolve().parents[2]
CALC_CONFIG = REPO / "examples" / "calc_agent" / "config.yaml"


def test_the_calc_config_loads_and_overrides_apply() -> None:
    config = load_train_config(CALC_CONFIG)
    assert config.model == "qwen2.5-0.5b" and config.agent == "examples.calc_agent.agent:calc_agent"
    assert config.grpo.advantage_estimator == "grpo_no_std" and config.grpo.async_rollouts == 0  # as agentbolt demo
    assert config.torch_trainer.loss_aggregation == "token_mean" and config.torch_trainer.kl_coef == 0.0
    assert config.trainer_settings.learning_rate == config.learning_rate == 2e-4

    changed = load_train_config(
        CALC_CONFIG,
        [
            "grpo.advantage_estimator=rloo",
            "grpo.async_rollouts=1",
            "grpo.stale_decay=0.25",
            "val_size=0",
            "torch_trainer.tis_cap=2",
            "out_dir=runs/x",
        ],
    )
    assert changed.grpo.advantage_estimator == "rloo" and changed.grpo.async_rollouts == 1
    assert changed.grpo.stale_decay == 0.25 and changed.grpo.effective_max_staleness == 1
    assert changed.val_size == 0 and changed.torch_trainer.tis_cap == 2 and changed.out_dir == Path("runs/x")
    assert changed.grpo.steps == config.grpo.steps  # the rest of the section is kept
    assert TrainConfig().grpo.effective_max_staleness == 0


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("grpo: [1, 2]", [], "grpo"),
        ("- a\n- b\n", [], "must hold a mapping"),
        ("grpo: {steps: -1}", [], "grpo.steps"),
        ("grpo: {stale_policy: keep}", [], "grpo.stale_policy"),
        ("nope: 1", [], "nope"),
        ("model: x\n  bad: [", [], "not valid YAML"),
        ("", ["grpo.steps"], "key=value"),
        ("model: x", ["model.sub=1"], "model is not a section"),
        # checked when parsed, against the registries and the trainer's own settings
        (
            "grpo: {advantage_estimator: nope}",
            [],
            "c.yaml: grpo.advantage_estimator: unknown advantage estimator 'nope'",
        ),
        ("grpo: {credit_assignment: nope}", [], "grpo.credit_assignment: unknown credit assignment 'nope'"),
        (
            "torch_trainer: {lora_rank: 8}",
            [],
            r"torch_trainer\.lora_rank: unknown setting; did you mean torch_trainer\.lora_r",
        ),
        # a typo: the nearest names of its section, and the --set item that made it (not the file)
        ("", ["grpo.stpes=1"], r"grpo\.stpes \(--set grpo\.stpes=1\): unknown setting; did you mean grpo\.steps\?"),
        ("lerning_rate: 1", [], r"lerning_rate: unknown setting; did you mean learning_rate\?"),
        ("", ["steps=2"], r"steps \(--set steps=2\): unknown setting; did you mean grpo\.steps\?"),  # wrong level
        ("checkpoint: {zzz: 1}", [], r"checkpoint\.zzz: unknown setting; known here: every, keep_last"),
        ("torch_trainer: {learning_rate: 0.1}", [], "set learning_rate at the top level"),
        ("agent_match: '('", [], "agent_match"),
        ("resume: true\noverwrite: true", [], "exclude each other"),
        ("report_to: [neptune]", [], "neptune"),
        ("", [], "is empty; write the job's settings"),
        ("# only a comment\n", [], "is empty"),
        ("runner_processes: 0", [], "runner_processes"),
        ("runner_concurrency: 0", [], "runner_concurrency"),
        ("max_batch_size: 0", [], "max_batch_size"),
    ],
)
def test_bad_configs_are_refused_with_the_field_named(
    tmp_path: Path, text: str, overrides: list[str], message: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_train_config(path, overrides)


def test_train_cli_refuses_bad_settings_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cases = [
        (["--set", "grpo.advantage_estimator=nope"], "unknown advantage estimator"),
        (["--set", "grpo.credit_assignment=nope"], "nope"),
        (["--set", "torch_trainer.lora_dropout=0.1"], "lora_dropout must be 0"),
        (["--set", "model=nope"], "unknown embedded model 'nope'"),
        (["--set", "tasks=no_such_module"], "cannot import the tasks module"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, ["train", str(CALC_CONFIG), "--out", str(out), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert not out.exists()
    result = CliRunner().invoke(app, ["train", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_plot_draws_one_curve_per_run(tmp_path: Path) -> None:
    paths = []
    for name, rewards in (("grpo", [0.1, 0.5, 0.9]), ("rloo", [0.2, 0.4])):
        run = tmp_path / name
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"advantage_estimator": name, "train_reward": rewards}))
        paths.append(str(run / "summary.json"))
    out = tmp_path / "curves.png"
    result = CliRunner().invoke(app, ["plot", *paths, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "grpo: [0.1, 0.5, 0.9]" in result.output and out.stat().st_size > 10_000
    # two runs with the same estimator: both curves say their folder (the first one did not); a null step is a gap
    paths = []
    for name, rewards in (("raise1", [None]), ("two2", [0.345, 0.875])):
        run = tmp_path / name
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"advantage_estimator": "grpo", "train_reward": rewards}))
        paths.append(str(run / "summary.json"))
    result = CliRunner().invoke(app, ["plot", *paths, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "grpo (raise1): [None]" in result.output and "grpo (two2): [0.345, 0.875]" in result.output
    (tmp_path / "bad.json").write_text("{}")
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "bad.json"), "--out", str(out)])
    assert result.exit_code == 2 and "no train_reward" in result.output


def test_the_algorithm_picks_the_config_type(tmp_path: Path) -> None:
    """``algorithm`` is the tag of a discriminated union: an RL field in an apo job (or the reverse) is refused by
    name, and an RL job's PPO estimator gets its value head."""
    from agentbolt.trainer.job_config import load_job_config

    path = tmp_path / "c.yaml"
    path.write_text("algorithm: apo\ngrpo: {steps: 2}\n")
    with pytest.raises(ConfigError, match="grpo"):
        load_job_config(path)
    path.write_text("algorithm: sft\n")
    with pytest.raises(ConfigError, match="algorithm 'sft' is unknown"):
        load_job_config(path)
    path.write_text("grpo: {advantage_estimator: gae}\n")
    job = load_job_config(path)
    assert isinstance(job, TrainConfig) and job.trainer_settings.value_head and not job.torch_trainer.value_head


def test_the_resolved_config_of_a_checkpoint_reads_back(tmp_path: Path) -> None:
    """``config.yaml`` in a checkpoint (every default filled in) loads back to the same settings, so
    ``agentbolt eval CKPT/config.yaml`` and ``--resume`` (which re-validates the loaded config) work."""
    from agentbolt.trainer.job import dump_config_yaml

    config = load_train_config(CALC_CONFIG, ["learning_rate=0.001", "torch_trainer.kl_coef=0.1"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config_yaml(config))
    again = load_train_config(path)
    assert again == config and again.trainer_settings.learning_rate == 0.001
    resumed = load_train_config(path, ["resume=true"])
    assert resumed.resume and resumed.torch_trainer.kl_coef == 0.1


def test_validation_bars_say_their_value_even_at_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0% bar has no height: its label is what shows it; a set scored only before (or after) says n/a."""
    import matplotlib.pyplot as plt

    from agentbolt.trainer.plots import plot_reward_curve

    closed: list = []
    monkeypatch.setattr(plt, "close", closed.append)  # keep the figure to read its texts back
    out = tmp_path / "reward_curve.png"
    plot_reward_curve(out, [0.2, None, 0.5], {"a": 0.0, "b": 0.5, "c": 0.125}, {"a": 1.0, "b": 0.0})
    assert out.stat().st_size > 10_000
    [figure] = closed
    bars = figure.axes[1]
    texts = [t.get_text() for t in bars.texts]
    assert sorted(texts) == sorted(["0%", "50%", "12.5%", "100%", "0%", "", "n/a"])
    figure.clf()


def test_a_tasks_file_has_no_test_split_and_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    tasks = load_tasks_module("mine.jsonl")
    with pytest.raises(
        ConfigError, match=r"'mine.jsonl' has no load_test_tasks\(\) \(a tasks file .*or use --split val"
    ):
        load_test_tasks(tasks, "mine.jsonl", "use --split val")
    monkeypatch.chdir(REPO)
    room = load_tasks_module("examples.room_agent.tasks")
    assert load_test_tasks(room, "examples.room_agent.tasks", "use --split val") == list(room.load_test_tasks())


def test_a_tasks_file_next_to_the_config_is_found_from_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_dir = tmp_path / "my_agent"
    agent_dir.mkdir()
    (agent_dir / "tasks.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (agent_dir / "val.jsonl").write_text('{"question": "2+2", "answer": "4"}\n')
    config_file = agent_dir / "config.yaml"
    config_file.write_text("agent: my_agent.agent:run\ntasks: tasks.jsonl\nval_tasks: val.jsonl\n")
    monkeypatch.chdir(tmp_path)  # the folder above: neither file is here
    config = load_train_config(config_file)
    assert config.tasks == str(agent_dir / "tasks.jsonl") and config.val_tasks == str(agent_dir / "val.jsonl")
    (tmp_path / "tasks.jsonl").write_text('{"question": "3+3", "answer": "6"}\n')  # one in the current folder wins
    assert load_train_config(config_file).tasks == str(tmp_path / "tasks.jsonl")
    config_file.write_text("agent: my_agent.agent:run\ntasks: tasks.jsonl\nval_tasks: missing.jsonl\n")  # nowhere
    with pytest.raises(ConfigError) as refused:
        load_train_config(config_file)
    assert "val_tasks file missing.jsonl does not exist" in str(refused.value)
    assert f"{tmp_path / 'missing.jsonl'} (the current folder)" in str(refused.value)
    assert f"{agent_dir / 'missing.jsonl'} (next to the config file)" in str(refused.value)
