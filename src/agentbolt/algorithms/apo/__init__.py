"""Prompt optimization without a GPU: APO (textual-gradient beam search) and a GEPA-style reflective Pareto
optimizer. Each candidate prompt is a new resources version in the store.

Entry points: :func:`optimize_apo` and :func:`optimize_gepa`. Both take an injected :class:`Evaluator` (runs a
candidate on tasks, returns rewards and traces) and an :class:`OptimizerLLM` (any OpenAI-compatible chat endpoint,
with an on-disk cache of its calls). Modules: ``types`` (data and interfaces), ``templates`` (the optimizer's prompts,
as files in ``templates/``), ``optimizer_llm`` (client and cache), ``candidates`` (publishing, evaluation book,
checks of proposed prompts), ``pareto`` (pure front, selection and merge rules), ``store_evaluator`` (the
evaluator through the store), ``beam`` (APO), ``gepa`` (GEPA).
"""

from __future__ import annotations

from .beam import optimize_apo
from .candidates import CandidatePublisher, EvaluationBook, ProgressCallback, ProgressEvent
from .config import APOConfig, GEPAConfig
from .gepa import optimize_gepa
from .optimizer_llm import CallCache, OptimizerLLM, OptimizerLLMConfig, build_optimizer_llm, call_key
from .pareto import merge_prompts, pareto_front, select_for_mutation
from .store_evaluator import StoreEvaluator, task_result_from_spans
from .templates import TemplateOverride, TemplateSet, load_templates
from .types import Candidate, Evaluator, OptimizationResult, ScoredCandidate, TaskResult, Trace, Usage

__all__ = [
    "APOConfig",
    "CallCache",
    "Candidate",
    "CandidatePublisher",
    "EvaluationBook",
    "Evaluator",
    "GEPAConfig",
    "OptimizationResult",
    "OptimizerLLM",
    "OptimizerLLMConfig",
    "ProgressCallback",
    "ProgressEvent",
    "ScoredCandidate",
    "StoreEvaluator",
    "TaskResult",
    "TemplateOverride",
    "TemplateSet",
    "Trace",
    "Usage",
    "build_optimizer_llm",
    "call_key",
    "load_templates",
    "merge_prompts",
    "optimize_apo",
    "optimize_gepa",
    "pareto_front",
    "select_for_mutation",
    "task_result_from_spans",
]
