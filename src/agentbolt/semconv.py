"""Span names and attribute keys (``Final`` strings). OpenTelemetry ``gen_ai.*`` keys are reused where they exist.

See https://opentelemetry.io/docs/specs/semconv/gen-ai/ for the ``gen_ai.*`` keys.
"""

from typing import Final

# Span names
SPAN_LLM_CALL: Final = "agentbolt.llm_call"
"""An LLM call recorded by the gateway, with exact token ids."""
SPAN_REWARD: Final = "agentbolt.reward"
"""A reward emitted by the agent (``emit_reward``) or returned by it."""
SPAN_EXCEPTION: Final = "agentbolt.exception"
"""An exception raised by the agent."""

# gen_ai.* keys (OpenTelemetry semantic conventions)
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASON: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
"""float: the temperature the call ran with (applied by the gateway: :mod:`agentbolt.server.gateway.sampling`)."""
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"

# agentbolt.* keys on LLM spans
LLM_PROMPT_TOKEN_IDS: Final = "agentbolt.llm.prompt_token_ids"
"""list[int]: the exact prompt token ids the model was fed."""
LLM_RESPONSE_TOKEN_IDS: Final = "agentbolt.llm.response_token_ids"
"""list[int]: the exact token ids the model generated (stop token included)."""
LLM_RESPONSE_LOGPROBS: Final = "agentbolt.llm.response_logprobs"
"""list[float]: sampling logprob of each generated token."""
LLM_REQUEST_MESSAGES: Final = "agentbolt.llm.request_messages"
"""list[dict]: the chat messages of the request, as sent."""
LLM_REQUEST_TOOLS: Final = "agentbolt.llm.request_tools"
LLM_REQUEST_PROMPT: Final = "agentbolt.llm.request_prompt"
"""str | list[int]: the raw prompt of a legacy Completions call (no chat messages)."""
LLM_PROTOCOL: Final = "agentbolt.llm.protocol"
"""str: the wire protocol of the call: ``chat.completions``, ``completions``, ``responses`` or ``messages``."""
LLM_REQUEST_CONSTRAINTS: Final = "agentbolt.llm.request_constraints"
"""dict: what constrained the answer (``tool_choice``, ``parallel_tool_calls``, ``response_format``), when set."""
LLM_STOP_SEQUENCE: Final = "agentbolt.llm.stop_sequence"
"""str: the stop string that ended generation (not in the returned text; its tokens are in the response ids)."""
LLM_RESPONSE_TEXT: Final = "agentbolt.llm.response_text"
"""str: the decoded generated text before tool-call parsing."""
LLM_RESPONSE_MESSAGE: Final = "agentbolt.llm.response_message"
"""dict: the OpenAI assistant message returned to the agent."""
LLM_TRAINABLE: Final = "agentbolt.llm.trainable"
"""bool: whether the call carries exact token ids and may become a training sample."""
LLM_MODEL_VERSION: Final = "agentbolt.llm.model_version"
"""str: the weights version that served the call (e.g. ``step-3``)."""
LLM_ERROR: Final = "agentbolt.llm.error"
LLM_SAMPLING_REQUESTED: Final = "agentbolt.llm.sampling_requested"
"""dict: the sampling fields the agent set in its request (``temperature``, ``top_p``, ``max_tokens``), when they
may differ from what was applied (``gen_ai.request.*``)."""

# Reward spans
REWARD_VALUE: Final = "agentbolt.reward.value"
REWARD_NAME: Final = "agentbolt.reward.name"
"""Optional name of a reward; the final reward is the last unnamed one."""
REWARD_ANSWER: Final = "agentbolt.reward.answer"
"""str: the agent's final answer as the reward function parsed it (shown to a prompt optimizer)."""
REWARD_FEEDBACK: Final = "agentbolt.reward.feedback"
"""str: one sentence about the outcome for a prompt optimizer (GEPA's textual feedback, arXiv:2507.19457 sec. 3.2)."""

# Exception spans
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"

# Attribution of spans that arrive over OTLP/HTTP (``POST /v1/traces``, see :mod:`agentbolt.server.otlp`).
# Each key is looked up on the span's own attributes first, then on its resource's attributes; so a span attribute
# takes precedence over a resource attribute, key by key. Both must resolve to non-empty strings.
ROLLOUT_ID: Final = "agentbolt.rollout_id"
"""str: the rollout a span belongs to (span attribute, or resource attribute as a fallback)."""
ATTEMPT_ID: Final = "agentbolt.attempt_id"
"""str: the attempt (of ``agentbolt.rollout_id``) a span belongs to (span attribute, or resource attribute)."""

# What OTLP carries beyond the span's own attributes, kept on the stored span under these keys (only when present).
OTEL_SCOPE_NAME: Final = "otel.scope.name"
"""str: name of the instrumentation scope (the tracer) that produced the span (OpenTelemetry key)."""
OTEL_SCOPE_VERSION: Final = "otel.scope.version"
"""str: version of the instrumentation scope (OpenTelemetry key)."""
OTLP_SPAN_KIND: Final = "agentbolt.otlp.span_kind"
"""str: ``SERVER``, ``CLIENT``, ``PRODUCER`` or ``CONSUMER``; absent for ``INTERNAL`` and unspecified spans."""
OTLP_RESOURCE: Final = "agentbolt.otlp.resource"
"""dict: the attributes of the span's resource (``service.name``, ``telemetry.sdk.*``...)."""
OTLP_EVENTS: Final = "agentbolt.otlp.events"
"""list[dict]: span events as ``{"name": str, "time": float epoch seconds, "attributes": dict}``."""
OTLP_LINKS: Final = "agentbolt.otlp.links"
"""list[dict]: span links as ``{"trace_id": hex, "span_id": hex, "attributes": dict}``."""

# Gateway facts on LLM spans (see agentbolt.server.gateway).
LLM_CHOICE_INDEX: Final = "agentbolt.llm.choice_index"
"""int: which choice of the request (0..n-1) the span records; a request with ``n`` choices makes ``n`` spans that
share ``gen_ai.response.id``, one transition each."""
LLM_STREAM: Final = "agentbolt.llm.stream"
"""bool: the call was answered as a server-sent event stream (recorded whole, once generation ended)."""
LLM_CLIENT_DISCONNECTED: Final = "agentbolt.llm.client_disconnected"
"""bool: the client went away mid-stream; the span holds what was generated until then, and is not trainable."""
LLM_ERROR_CODE: Final = "agentbolt.llm.error_code"
"""str: OpenAI-style code of a failed call (``context_length_exceeded``, ``upstream_error``, ...)."""
LLM_NOT_TRAINABLE_REASON: Final = "agentbolt.llm.not_trainable_reason"
"""str: why ``agentbolt.llm.trainable`` is False (no token ids, failed call, client gone, answer not delivered)."""
LLM_SWAP_WAIT_S: Final = "agentbolt.llm.swap_wait_s"
"""float: seconds the call waited at the gateway for a weight swap to end (absent when it did not wait)."""

# Agent-side spans of agentbolt.tracing (emit_message, emit_object, @operation).
SPAN_MESSAGE: Final = "agentbolt.message"
"""A text message recorded by the agent (``emit_message``)."""
MESSAGE_TEXT: Final = "agentbolt.message.text"
"""str: the message, whole."""
SPAN_OBJECT: Final = "agentbolt.object"
"""A structured value recorded by the agent (``emit_object``)."""
OBJECT_JSON: Final = "agentbolt.object.json"
"""str: the value as JSON text, bounded (rules in :mod:`agentbolt.tracing.serialize`)."""
OBJECT_TYPE: Final = "agentbolt.object.type"
"""str: the Python type (``__qualname__``) of the value."""
SPAN_OPERATION: Final = "agentbolt.operation"
"""A call of a function decorated with ``@operation``; what it records nests under it."""
OPERATION_NAME: Final = "agentbolt.operation.name"
"""str: the operation's name (default: the function's ``__qualname__``)."""
OPERATION_INPUT: Final = "agentbolt.operation.input"
"""str: JSON text of the bound arguments by parameter name (without ``self``/``cls``), bounded."""
OPERATION_OUTPUT: Final = "agentbolt.operation.output"
"""str: JSON text of the returned value, bounded; absent when the call raised."""

# Agent names (``agentbolt.agent(...)``, see :mod:`agentbolt.tracing.agents`; read by :mod:`agentbolt.adapter.agents`).
SPAN_AGENT: Final = "agentbolt.agent"
"""A scope of the agent's code run under an agent name (``with agentbolt.agent("writer"):``); what it records
(LLM calls of an instrumented client, tools, nested agents) nests under it."""
AGENT_NAME: Final = "agentbolt.agent.name"
"""str: the agent name a span was recorded under: on ``agentbolt.agent`` spans, and on gateway LLM spans of a call
that sent the ``x-agentbolt-agent`` header."""
AGENT_NAME_HEADER: Final = "x-agentbolt-agent"
"""HTTP request header: the agent name of a gateway call (e.g. ``openai.OpenAI(default_headers={...})``); recorded
as ``agentbolt.agent.name`` on the call's spans."""

# OpenInference keys (https://github.com/Arize-ai/openinference/blob/main/spec/semantic_conventions.md), as the
# instrumentors of agentbolt.tracing.instrument write them. Kept here so the adapter needs no openinference package.
OI_SPAN_KIND: Final = "openinference.span.kind"
"""str: ``LLM``, ``AGENT``, ``CHAIN``, ``TOOL``, ``RETRIEVER``, ... (the kind of an OpenInference span)."""
OI_SPAN_KIND_LLM: Final = "LLM"
OI_SPAN_KIND_AGENT: Final = "AGENT"
OI_AGENT_NAME: Final = "agent.name"
"""str: an agent's name (openai-agents agent spans)."""
OI_GRAPH_NODE_ID: Final = "graph.node.id"
"""str: id of a node of the agent graph (openai-agents: the agent name; CrewAI: the agent's role)."""
OI_METADATA: Final = "metadata"
"""str: JSON object of free metadata (LangChain: the run's metadata; LangGraph puts ``langgraph_node`` there)."""
OI_INPUT_VALUE: Final = "input.value"
"""str: the span's input (JSON text for the openai instrumentor: the request parameters, messages included)."""
OI_OUTPUT_VALUE: Final = "output.value"
"""str: the span's output (JSON text for the openai instrumentor: the response, its ``id`` included)."""
OI_LLM_INPUT_MESSAGES: Final = "llm.input_messages"
"""Prefix of the flattened request messages: ``llm.input_messages.<i>.message.role`` / ``.message.content`` /
``.message.contents.<j>.message_content.text`` / ``.message.tool_calls.<j>.tool_call.function.name`` /
``.message.tool_calls.<j>.tool_call.function.arguments``."""
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""str: ``chat``, ``text_completion``... on OpenTelemetry GenAI client spans (a tracer-side LLM span)."""
