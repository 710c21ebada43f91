"""Tasks of a train job are loaded and checked before anything else: JSON Lines files named in the config (errors
give FILE:LINE) and tasks modules (errors give the module, the function and the item's index)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentbolt.errors import ConfigError
from agentbolt.trainer.job_config import TrainConfig, check_tasks, load_task_sets, read_tasks_file


def test_a_jsonl_file_gives_one_task_per_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"q": 1}\n\n  \n{"q": 2, "nested": {"a": [1]}}\n')
    assert read_tasks_file(path) == [{"q": 1}, {"q": 2, "nested": {"a": [1]}}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"q": 1}\n[1, 2]\n', "t.jsonl:2: a task must be a JSON object, got a list"),
        ('{"q": 1}\n\nnull\n', "t.jsonl:3: a task must be a JSON object, got null"),
        ('{"q": 1}\n{"q": \n', "t.jsonl:2: not valid JSON"),
        ("\n\n", "holds no task"),
    ],
)
def test_a_bad_jsonl_file_is_named_by_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        read_tasks_file(path)


def test_a_missing_tasks_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_tasks_file(tmp_path / "nope.jsonl")


def test_module_tasks_must_be_json_objects() -> None:
    assert check_tasks(({"a": 1},), "src") == [{"a": 1}]
    with pytest.raises(ConfigError, match="src: item 1 is a string"):
        check_tasks([{"a": 1}, "x"], "src")
    with pytest.raises(ConfigError, match="src: item 0 is an object .* string keys"):
        check_tasks([{1: "a"}], "src")
    with pytest.raises(ConfigError, match="src: item 0 cannot be stored as JSON"):
        check_tasks([{"a": object()}], "src")
    with pytest.raises(ConfigError, match="src returned a string, not a list"):
        check_tasks("abc", "src")


def test_task_sets_from_jsonl_files_in_the_config(tmp_path: Path) -> None:
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text("".join(f'{{"q": {i}}}\n' for i in range(5)))
    val.write_text("".join(f'{{"q": {i}}}\n' for i in range(10, 14)))
    config = TrainConfig(tasks=str(train), train_size=3, val_tasks=str(val), val_size=2)
    assert load_task_sets(config) == ([{"q": 0}, {"q": 1}, {"q": 2}], {"val": [{"q": 10}, {"q": 11}]})
    # no val_tasks: no evaluation; val_size 0: the validation file is not read
    assert load_task_sets(TrainConfig(tasks=str(train)))[1] == {}
    val.write_text("not json\n")
    assert load_task_sets(config.model_copy(update={"val_size": 0}))[1] == {}
    with pytest.raises(ConfigError, match="val.jsonl:1: not valid JSON"):
        load_task_sets(config)


def test_val_tasks_must_be_a_jsonl_file() -> None:
    with pytest.raises(ValueError, match="val_tasks must be a JSON Lines file"):
        TrainConfig(val_tasks="my.module")


def test_a_bad_validation_task_of_a_module_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_val_tasks_mod.py").write_text(
        "def load_train_tasks(size):\n    return [{'q': 1}]\n\n"
        "def load_val_sets(n_per_set):\n    return {'easy': [{'q': 2}, 7]}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bad_val_tasks_mod", raising=False)
    with pytest.raises(
        ConfigError, match=r"tasks module 'bad_val_tasks_mod' load_val_sets\(\) set 'easy': item 1 is an int"
    ):
        load_task_sets(TrainConfig(tasks="bad_val_tasks_mod"))


def test_eval_of_a_checkpoint_reads_the_val_tasks_file_of_the_job(tmp_path: Path) -> None:
    from agentbolt.trainer.checkpoint_eval import checkpoint_split_sets

    train, val = tmp_path / "train.jsonl", tmp_path / "held_out.jsonl"
    train.write_text('{"q": 1}\n')
    val.write_text('{"q": 10}\n{"q": 11}\n{"q": 12}\n')
    config = TrainConfig(tasks=str(train), val_tasks=str(val), val_size=2)
    assert checkpoint_split_sets(config, "val") == {"held_out": [{"q": 10}, {"q": 11}]}  # as the train job reads it
    without = TrainConfig(tasks=str(train))
    with pytest.raises(ConfigError, match="val_tasks: FILE.jsonl"):
        checkpoint_split_sets(without, "val")


def test_a_tasks_file_job_finds_its_agent_module_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a new-user pass: with `tasks: train.jsonl`, `agent: myagent.agent:fn` did not import from the folder
    the user ran `agentbolt train` in (the console script does not put it on sys.path; only a tasks module did)."""
    from agentbolt.runner.processes import load_agent
    from agentbolt.trainer.job_config import load_tasks_module

    (tmp_path / "myagent_pkg").mkdir()
    (tmp_path / "myagent_pkg" / "__init__.py").write_text("")
    (tmp_path / "myagent_pkg" / "agent.py").write_text("def color_agent(task, llm):\n    return 1.0\n")
    (tmp_path / "train.jsonl").write_text('{"q": 1}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ConfigError, match="cannot import agent module"):
        load_agent("myagent_pkg.agent:color_agent")
    load_tasks_module("train.jsonl")
    assert load_agent("myagent_pkg.agent:color_agent").name == "color_agent"
    sys.modules.pop("myagent_pkg.agent", None)
    sys.modules.pop("myagent_pkg", None)


def test_an_agent_module_that_fails_to_import_is_named_with_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a new-user pass: a missing package imported BY the agent module was reported as the module not being
    found (with advice about PYTHONPATH), and a syntax error in it printed a raw traceback."""
    from agentbolt.runner.processes import load_agent

    (tmp_path / "dep_agent_mod.py").write_text("import no_such_package_xyz\n\ndef f(task, llm):\n    return 1.0\n")
    (tmp_path / "syntax_agent_mod.py").write_text("def f(task, llm)\n    return 1.0\n")
    (tmp_path / "raising_agent_mod.py").write_text("raise RuntimeError('no API key set')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="imports 'no_such_package_xyz', which is not installed"):
            load_agent("dep_agent_mod:f")
        with pytest.raises(ConfigError, match=r"'syntax_agent_mod' failed to import: SyntaxError.*line 1"):
            load_agent("syntax_agent_mod:f")
        with pytest.raises(ConfigError, match="failed to import: RuntimeError: no API key set"):
            load_agent("raising_agent_mod:f")
        with pytest.raises(ConfigError, match="cannot import agent module 'absent_agent_mod'.*PYTHONPATH"):
            load_agent("absent_agent_mod:f")
        # found by a new-user pass: a wrong attribute name was refused with no hint
        (tmp_path / "named_agent_mod.py").write_text(
            "from agentbolt import rollout\n\n@rollout\ndef convert(task, llm):\n    return 1.0\n\n"
            "def helper(x):\n    return x\n"
        )
        with pytest.raises(
            ConfigError,
            match="no attribute 'nope'; the agents and functions it defines: convert, "
            "helper; set agent: named_agent_mod:NAME",
        ):
            load_agent("named_agent_mod:nope")
    finally:
        for name in ("dep_agent_mod", "syntax_agent_mod", "raising_agent_mod", "named_agent_mod"):
            sys.modules.pop(name, None)
