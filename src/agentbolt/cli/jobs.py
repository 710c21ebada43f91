"""The job commands of the ``agentbolt`` CLI: ``demo``, ``train``, ``eval``, ``plot`` and ``export-model``
(registered on the app in :mod:`agentbolt.cli.main`). Each parses its options into a config and calls one function;
heavy modules are imported inside the commands."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import typer
from pydantic import ValidationError

from agentbolt.cli.command_name import agentbolt_command
from agentbolt.cli.common import console, fail, run_job
from agentbolt.errors import AgentboltError

DEMO_ADVANTAGE_ESTIMATOR = "grpo_no_std"
"""The demo's advantage: the reward minus the group mean, not divided by the group's std (Dr. GRPO, Liu et al. 2025,
arXiv:2503.20783). Dividing by the std made a group whose rewards differ by 0.2 (a well-formed tool call that never
answers against no call) as strong a signal as a correct answer: in a demo run whose first step had no answered
rollout, the calls that looped got advantage +1.5, every rollout looped from step 2 on, and nothing was learned.
Measured on 2026-12-03/04: 3 of 7 demo runs with ``grpo`` learned nothing, 1 of 7 with ``grpo_no_std`` (the
loop still won there). Few runs: a lead, not a verdict."""


def demo(
    steps: int = typer.Option(4, help="GRPO steps"),
    out: Path = typer.Option(Path("runs/demo"), help="output directory"),
    model: str = typer.Option("qwen2.5-0.5b", help="embedded model: qwen2.5-0.5b, qwen2.5-coder-1.5b or smollm2-135m"),
    tasks_per_step: int = typer.Option(4, help="distinct tasks per step"),
    group_size: int = typer.Option(4, help="rollouts per task (GRPO group)"),
    val_size: int = typer.Option(8, help="tasks per validation set"),
    overwrite: bool = typer.Option(False, help="replace an existing OUT/store.db"),
    seed: int = typer.Option(0, help="task sampling seed"),
    device: str = typer.Option("cpu", help="where the model is served and trained: cpu, cuda or cuda:N"),
    advantage_estimator: str = typer.Option(
        DEMO_ADVANTAGE_ESTIMATOR,
        help="grpo_no_std (R - group mean), grpo (also divided by the group's std), rloo, reinforce_pp or "
        "reinforce_pp_baseline",
    ),
) -> None:
    """Train the calculator agent with GRPO on this machine and report validation accuracy before and after."""
    from agentbolt.config import GRPOConfig
    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.job_config import TrainConfig

    logging.basicConfig(level=logging.WARNING)
    try:
        config = TrainConfig(
            out_dir=out,
            model=model,
            grpo=GRPOConfig(
                steps=steps,
                tasks_per_step=tasks_per_step,
                group_size=group_size,
                seed=seed,
                advantage_estimator=advantage_estimator,
            ),
            val_size=val_size,
            overwrite=overwrite,
            device=device,
        )
        run_job(run_training(config, console))
    except (AgentboltError, ValidationError) as exc:
        fail(exc, {"out_dir": "--out"})


def train(
    config: Path = typer.Argument(..., help="YAML file of the job's settings, e.g. examples/calc_agent/config.yaml"),
    set_: list[str] | None = typer.Option(
        None,
        "--set",
        help="override one setting, as dotted.key=value (repeatable), e.g. --set grpo.advantage_estimator=rloo",
    ),
    out: Path | None = typer.Option(None, help="output directory (overrides out_dir of the file)"),
    overwrite: bool = typer.Option(False, help="replace an existing OUT/store.db and OUT/checkpoints"),
    resume: bool = typer.Option(
        False, help="RL: continue the run in OUT from its newest complete checkpoint, on the same store"
    ),
) -> None:
    """Train an agent on this machine from a YAML config: LightningRL (writes store.db, checkpoints/step-N,
    summary.json, reward_curve.png), or with algorithm apo / gepa prompt optimization (writes store.db, summary.json,
    the best prompt and its diff from the seed)."""
    from agentbolt.errors import ConfigError
    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.job_config import TrainConfig, load_job_config, validate_settings
    from agentbolt.trainer.prompt_opt import run_prompt_optimization

    logging.basicConfig(level=logging.WARNING)
    overrides = list(set_ or [])
    if out is not None:
        overrides.append(f"out_dir={out}")
    if overwrite:
        overrides.append("overwrite=true")
    try:
        job = load_job_config(config, overrides)
        if resume:
            if not isinstance(job, TrainConfig):
                raise ConfigError(f"{config}: --resume continues an RL run; a prompt-optimization job cannot resume")
            job = validate_settings(TrainConfig, {**job.to_settings(), "resume": True}, config)
        if isinstance(job, TrainConfig):
            sets = [arg for item in set_ or [] for arg in ("--set", item)]
            resume_command = " ".join(
                [agentbolt_command(), shlex.join(["train", str(config), "--out", str(job.out_dir), *sets, "--resume"])]
            )
            store_file = job.out_dir / "store.db"
            out_dir = job.out_dir

            def on_stop() -> str:  # stopped before the store existed (e.g. while the model loaded): nothing to resume
                from agentbolt.trainer.checkpoint import list_checkpoints

                if not store_file.exists():
                    return "nothing was run yet: start it again with the same command"
                if list_checkpoints(out_dir):
                    return f"continue it from its last checkpoint: {resume_command}"
                return f"no checkpoint was written yet: {resume_command} starts the steps over"

            run_job(run_training(job, console), on_stop=on_stop)
        else:
            run_job(run_prompt_optimization(job, console))
    except (AgentboltError, ValidationError) as exc:
        fail(exc)


def eval_(
    config: Path = typer.Argument(
        ...,
        help="YAML file of the job: an RL config with --checkpoint (examples/calc_agent/config.yaml), or a "
        "prompt-optimization config with --resources (examples/room_agent/config.yaml)",
    ),
    checkpoint: Path | None = typer.Option(
        None, help="RL: the checkpoint to score, OUT/checkpoints/step-N (its LoRA adapter is served)"
    ),
    resources: str | None = typer.Option(None, help="prompt optimization: the resources version to evaluate (rs-N)"),
    split: str = typer.Option(
        "val", help="val (the validation tasks the train job scores) or test (the tasks module's load_test_tasks)"
    ),
    store: Path | None = typer.Option(
        None, help="prompt optimization: the SQLite store file holding the version (default: out_dir/store.db)"
    ),
    out: Path | None = typer.Option(
        None,
        help="where eval.json (and, for a checkpoint, a new store.db) is written (default: out_dir/eval-rs-N-SPLIT, "
        "or OUT/eval-step-N-SPLIT beside the checkpoints)",
    ),
    overwrite: bool = typer.Option(False, help="checkpoint: replace the store of an earlier evaluation in --out"),
    set_: list[str] | None = typer.Option(
        None, "--set", help="override one setting of the config, as dotted.key=value (repeatable), e.g. --set model=..."
    ),
) -> None:
    """Score a trained agent on a config's val or test tasks with the config's model and agent: an RL checkpoint
    (its adapter served; a new store in the output folder) or a stored prompt version (rollouts go into its store).
    The accuracy table is printed and written to eval.json."""
    from agentbolt.errors import ConfigError
    from agentbolt.trainer.job_config import TrainConfig, load_job_config

    logging.basicConfig(level=logging.WARNING)
    try:
        job = load_job_config(config, list(set_ or []))
        if isinstance(job, TrainConfig):
            if checkpoint is None or resources is not None:
                raise ConfigError(
                    f"{config} is an RL job: score one of its checkpoints with --checkpoint OUT/checkpoints/step-N"
                )
            from agentbolt.trainer.checkpoint_eval import run_checkpoint_eval

            run_job(
                run_checkpoint_eval(
                    job, checkpoint=checkpoint, split=split, out_dir=out, overwrite=overwrite, console=console
                )
            )
            return
        if resources is None or checkpoint is not None:
            raise ConfigError(f"{config} is a prompt-optimization job: name the prompt version with --resources rs-N")
        from agentbolt.trainer.evaluate import run_eval

        run_job(run_eval(job, resources_id=resources, split=split, store_path=store, out_dir=out, console=console))
    except (AgentboltError, ValidationError) as exc:
        fail(exc)


def plot(
    summaries: list[Path] = typer.Argument(..., help="summary.json files written by agentbolt train / demo"),
    out: Path = typer.Option(Path("reward_curves.png"), help="the PNG to write"),
    label: str = typer.Option(
        "advantage_estimator",
        help="the summary field that names each curve (advantage_estimator, credit_assignment, async_rollouts), "
        "or 'dir' for the run's folder name",
    ),
) -> None:
    """Plot the train-reward curves of several runs in one figure (e.g. one run per advantage estimator)."""
    import json

    from agentbolt.trainer.plots import plot_reward_curves

    read: list[tuple[str, Path, list[float | None]]] = []
    try:
        for path in summaries:
            try:
                summary = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise AgentboltError(f"cannot read {path}: {exc}") from None
            if not isinstance(summary, dict) or "train_reward" not in summary:
                raise AgentboltError(f"{path} is not a summary.json of agentbolt train (no train_reward)")
            name = path.parent.name if label == "dir" else str(summary.get(label, path.parent.name))
            read.append((name, path, [None if x is None else float(x) for x in summary["train_reward"]]))
        names = [name for name, _, _ in read]
        runs: dict[str, list[float | None]] = {}
        for name, path, rewards in read:
            if names.count(name) > 1:  # the same label for several runs: every one of them says its folder
                name = f"{name} ({path.parent.name})"
            while name in runs:
                name = f"{name} ({path.parent})"
            runs[name] = rewards
            console.print(f"{name}: {[None if r is None else round(r, 3) for r in rewards]}")
        plot_reward_curves(out, runs)
    except AgentboltError as exc:
        fail(exc)
    console.print(f"wrote {out}")


def export_model(
    checkpoint: Path = typer.Argument(
        ..., help="a checkpoint folder written by a training run: OUT/checkpoints/step-N"
    ),
    out: Path = typer.Option(..., help="the folder to write (a Hugging Face model folder)"),
    gguf: bool = typer.Option(False, "--gguf", help="also write model.gguf for llama.cpp / Ollama (embedded models)"),
    gguf_dtype: str = typer.Option("f16", help="weight type of the GGUF: f16 (widest support) or bf16 (bit-exact)"),
    overwrite: bool = typer.Option(False, help="replace OUT if it exists and is not empty"),
) -> None:
    """Merge a checkpoint's LoRA adapter into its base model and write a model folder that plain transformers loads
    (and, with --gguf, a GGUF for llama.cpp and Ollama): the weights the agent was served during training."""
    from agentbolt.trainer.export_model import GGUF_FILE, export_merged_model

    logging.basicConfig(level=logging.WARNING)
    try:
        with console.status(f"merging {checkpoint} into its base model"):
            result = export_merged_model(
                checkpoint,
                out,
                gguf=gguf,
                gguf_dtype=gguf_dtype,  # type: ignore[arg-type]  # checked by export_merged_model
                overwrite=overwrite,
            )
    except AgentboltError as exc:
        fail(exc)
        return
    console.print(
        f"wrote {result.out_dir} ({result.size_bytes / 1e6:.0f} MB, {result.duration_s:.1f} s): {result.model} with "
        f"the LoRA adapter of {result.checkpoint_dir} merged into {result.merged_tensors} weight matrices"
    )
    console.print("  " + ", ".join(result.files))
    console.print("load it with transformers:")
    console.print(
        "  from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"  model = AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r})\n"
        f"  tokenizer = AutoTokenizer.from_pretrained({str(result.out_dir)!r})",
        markup=False,
        highlight=False,
    )
    if result.gguf_file is not None:
        console.print(f"the GGUF ({result.gguf_dtype}): {result.gguf_file}")
        console.print(f"  llama.cpp: llama-cli -m {result.gguf_file}", markup=False, highlight=False)
        console.print(
            f"  Ollama: a Modelfile with the line 'FROM {result.gguf_file}', then ollama create NAME -f Modelfile",
            markup=False,
            highlight=False,
        )
    else:
        console.print(f"  (for llama.cpp / Ollama, export with --gguf: it adds {GGUF_FILE})", highlight=False)
