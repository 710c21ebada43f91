"""Resources: the versioned, named set of what an agent is given (LLM endpoints, prompt templates)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class LLM(BaseModel):
    """An OpenAI-compatible LLM endpoint.

    Attributes:
        endpoint: base URL to hand to an OpenAI client (ends in ``/v1``). In the store it is the gateway root; the
            runner hands the agent a copy scoped to its attempt (see :meth:`for_attempt`).
        model: model name to put in requests.
        sampling_parameters: defaults such as ``temperature`` the agent should use; the gateway applies
            ``temperature``, ``top_p`` and ``max_tokens`` to calls that leave them unset
            (:mod:`agentbolt.server.gateway.sampling`).
        sampling_enforced: the gateway applies ``sampling_parameters`` to every call of a rollout under this version,
            whatever the agent asks (``max_tokens`` only lowered by a smaller request). Train and eval jobs set it:
            the trainer's logprobs and the evaluation table assume the job's settings.
    """

    model_config = ConfigDict(frozen=True)

    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    sampling_enforced: bool = False

    def for_attempt(self, rollout_id: str, attempt_id: str) -> LLM:
        """Return a copy whose endpoint is the gateway URL scoped to one attempt.

        ``http://host:port`` becomes ``http://host:port/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1``; every
        call made through it is recorded as a span of that attempt.
        """
        root = self.endpoint.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        scoped = f"{root}/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1"
        return self.model_copy(update={"endpoint": scoped})


class PromptTemplate(BaseModel):
    """A prompt with ``{placeholders}`` filled by :meth:`format` (Python ``str.format`` syntax)."""

    model_config = ConfigDict(frozen=True)

    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["f-string"] = "f-string"

    def format(self, **values: Any) -> str:
        """Fill the template. Raises ``KeyError`` naming a placeholder that has no value."""
        return self.template.format(**values)


Resource = Annotated[LLM | PromptTemplate, Field(discriminator="resource_type")]


class ResourcesUpdate(BaseModel):
    """One immutable version of the named resources.

    Attributes:
        resources_id: store-assigned version id (``rs-<n>``, n = 1, 2, ... in order of creation).
        version: the same n as an integer, for sorting.
        resources: name -> resource.
        create_time: epoch seconds.
        metadata: e.g. ``{"train_step": 3}`` or the model checkpoint it points to.
    """

    resources_id: str
    version: int
    resources: dict[str, Resource]
    create_time: float
    metadata: dict[str, Any] = Field(default_factory=dict)
