"""Frozen configs of the two prompt optimizers. They hold no live handles and round-trip through YAML."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .templates import TemplateOverride


class APOConfig(BaseModel):
    """Textual-gradient beam search (APO; Pryzant et al., 2023, "Automatic Prompt Optimization with 'Gradient
    Descent' and Beam Search", arXiv:2305.03495; as in agent-lightning's APO).

    Calls per round: ``2 * beam_width * branch_factor`` optimizer requests (one critique and one edit per branch);
    rollouts per round: at most ``beam_width * train_batch_size`` on train plus ``beam_width * branch_factor *
    val_batch_size`` on validation (a candidate is never run twice on the same task and mode).

    Attributes:
        prompt_name: the prompt resource to edit; ``None`` means the only prompt of the seed (an error when it has
            several). Other prompts are carried along unchanged.
        rounds: rounds of critique, edit and selection.
        beam_width: candidates kept after each round (by mean validation reward; the older one wins a tie).
        branch_factor: edited prompts asked per beam member per round.
        train_batch_size: training tasks drawn (without replacement, seeded) per round; the beam is run on them.
        worst_k: lowest-reward traces of that batch shown to the critique.
        val_batch_size: validation tasks every candidate is scored on (a fixed seeded draw); ``None`` = all.
        seed: seed of every random draw.
        max_trace_chars: characters per trace shown to the optimizer.
        templates: overrides of ``critique`` / ``edit`` (see :class:`TemplateOverride`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_name: str | None = None
    rounds: int = Field(default=3, ge=1)
    beam_width: int = Field(default=2, ge=1)
    branch_factor: int = Field(default=2, ge=1)
    train_batch_size: int = Field(default=8, ge=1)
    worst_k: int = Field(default=4, ge=1)
    val_batch_size: int | None = Field(default=None, ge=1)
    seed: int = 0
    max_trace_chars: int = Field(default=3000, ge=200)
    templates: dict[str, TemplateOverride] = Field(default_factory=dict)


class GEPAConfig(BaseModel):
    """Reflective Pareto optimizer (GEPA; Agrawal et al., 2025, "GEPA: Reflective Prompt Evolution Can Outperform
    Reinforcement Learning", arXiv:2507.19457, Algorithms 1-2 and section 3.4 for merge).

    Attributes:
        max_iterations: iterations at most (each is one reflective mutation or one merge attempt).
        max_rollouts: rollout budget; no iteration starts once it is reached (``None``: no budget). The seed's
            validation run counts.
        minibatch_size: training tasks per reflective mutation; the child must beat its parent's sum of rewards on
            this minibatch before it is scored on the whole validation set.
        reflection_traces: full traces shown per reflection, the parent's lowest-reward ones on the minibatch (a
            tie keeps minibatch order); every task still gets a one-line outcome (``{outcomes}``). ``None`` = all,
            as in the paper. A small optimizer needs few: Qwen2.5-Coder-1.5B shown 8 traces of the room agent pasted
            them back instead of writing a prompt (measured).
        perfect_score: a minibatch on which the parent already scores this on every task is skipped (nothing to
            learn from it, GEPA's ``skip_perfect_score``).
        prompt_names: the prompts to mutate, in round-robin order per candidate; ``None`` = all of the seed's.
        use_merge: try a merge after each accepted mutation.
        max_merges: merges accepted at most.
        merge_subsample_size: validation tasks a merged candidate is checked on first; it must score at least the
            better parent's sum there.
        seed: seed of every random draw.
        max_trace_chars: characters per trace shown to the optimizer.
        templates: override of ``reflect`` (see :class:`TemplateOverride`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_iterations: int = Field(default=20, ge=1)
    max_rollouts: int | None = Field(default=None, ge=1)
    minibatch_size: int = Field(default=4, ge=1)
    reflection_traces: int | None = Field(default=None, ge=1)
    perfect_score: float = 1.0
    prompt_names: list[str] | None = None
    use_merge: bool = True
    max_merges: int = Field(default=5, ge=0)
    merge_subsample_size: int = Field(default=5, ge=1)
    seed: int = 0
    max_trace_chars: int = Field(default=3000, ge=200)
    templates: dict[str, TemplateOverride] = Field(default_factory=dict)
