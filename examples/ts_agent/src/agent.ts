/**
 * A calc agent in TypeScript that agentbolt trains with no Python SDK: a runner loop speaking only HTTP.
 *
 * For each rollout it claims (`POST /v1/claims`), the runner:
 *   1. reads the attempt's resources version (`GET /v1/resources/{id}`) and its `llm` resource, and scopes the
 *      gateway URL to the attempt (`{endpoint}/rollouts/{rollout_id}/attempts/{attempt_id}/v1`, as
 *      `agentbolt.types.LLM.for_attempt`), so every LLM call is recorded under it with exact token ids;
 *   2. marks the attempt `running` (`POST /v1/rollouts/{rid}/attempts/{aid}/status`), heartbeating its lease;
 *   3. runs the agent on the task (`{"question": ..., "answer": ...}`) with the official `openai` client: a first
 *      call that must call the `calculate` tool (`tool_choice: "required"`), the tool, and a second call, without
 *      tools, for the answer (at most `--answer-max-tokens` tokens);
 *   4. scores it: reward 1.0 when the final reply contains the gold number, else 0.0;
 *   5. records its own OpenTelemetry spans (`agent.run`, one GenAI `chat` span per call, `execute_tool` spans and an
 *      `agentbolt.reward` span) and exports them to `POST {server}/v1/traces` (OTLP/HTTP);
 *   6. reports `succeeded` with the `final_reward` (or `failed` with the error).
 * It exits when `--idle-polls` claims in a row found the queue empty.
 *
 * Usage: node dist/agent.js --server http://127.0.0.1:8000 [--token T] [--worker-id ID] [--concurrency N]
 *        [--idle-polls N] [--poll-interval-s S] [--answer-max-tokens N]
 * Output: one JSON line per LLM call (`"event": "llm_call"`) and per attempt (`"event": "attempt"`) on stdout, and a
 * summary (`"event": "done"`) last.
 */

import { hostname } from "node:os";
import { parseArgs } from "node:util";

import { context, propagation, type Span, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import OpenAI from "openai";
import type { ChatCompletion, ChatCompletionMessageParam } from "openai/resources/chat/completions";

import { CALCULATE_TOOL, calculate, containsNumber, formatNumber } from "./calculator.js";
import { type AttemptedRollout, forAttempt, type LLMResource, StoreClient } from "./store.js";
import { type AttemptIds, AttemptTracing, semconv } from "./tracing.js";

const AGENT_NAME = "ts-calc";
const SYSTEM_PROMPT =
  "You are a math assistant with a calculate tool. Call it with the arithmetic expression, " +
  "then reply with a final line: Answer: <number>";

/**
 * The `tool` message of a call: a value comes as the answer line to give, with a reminder to give it (after the
 * calc agent's `TOOL_RESULT_FORMAT`, `examples/calc_agent/agent.py`: with the bare value the untrained model rarely
 * answers; SmolLM2-135M tends to repeat the first line it reads, so the answer line comes first).
 */
function toolMessage(result: string): string {
  if (result.startsWith("Error:")) return result;
  return `Answer: ${result}\n(the exact value of the expression; reply with this line)`;
}

/** A calc task as the trainer enqueues it. */
interface CalcTask {
  question: string;
  answer: string | number;
}

interface Options {
  server: string;
  token: string | undefined;
  workerId: string;
  concurrency: number;
  idlePolls: number;
  pollIntervalS: number;
  heartbeatIntervalS: number;
  llmTimeoutS: number;
  answerMaxTokens: number;
}

interface Outcome {
  reward: number;
  reply: string;
  toolCalls: number;
}

const stats = { succeeded: 0, failed: 0 };
let stopping = false;

function log(event: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(event)}\n`);
}

function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

function parseTask(input: unknown): CalcTask {
  const task = input as Partial<CalcTask> | null;
  if (
    !task ||
    typeof task.question !== "string" ||
    (typeof task.answer !== "string" && typeof task.answer !== "number")
  ) {
    throw new Error(
      `the rollout input is not a calc task {"question": str, "answer": str | number}: ${JSON.stringify(input)}`,
    );
  }
  return { question: task.question, answer: task.answer };
}

/** The `llm` resource of a version (by that name, else the first LLM in it). */
function llmOf(resources: Record<string, { resource_type: string }>): LLMResource {
  const named = resources.llm;
  if (named?.resource_type === "llm") return named as LLMResource;
  const first = Object.values(resources).find((r) => r.resource_type === "llm");
  if (!first)
    throw new Error(`the resources version has no llm resource (it has: ${Object.keys(resources).join(", ")})`);
  return first as LLMResource;
}

/** The agent's run of one task. */
class Episode {
  private readonly client: OpenAI;
  private readonly answerMaxTokens: number;

  constructor(
    private readonly ids: AttemptIds,
    private readonly llm: LLMResource,
    private readonly tracing: AttemptTracing,
    options: Options,
  ) {
    this.answerMaxTokens = options.answerMaxTokens;
    this.client = new OpenAI({
      baseURL: forAttempt(llm.endpoint, ids.rolloutId, ids.attemptId),
      apiKey: options.token ?? "unused",
      // One request, one recorded call: no silent retry (the SDK would also retry the gateway's 409 for an attempt
      // that has ended).
      maxRetries: 0,
      timeout: options.llmTimeoutS * 1000,
      defaultHeaders: { [semconv.AGENT_NAME_HEADER]: AGENT_NAME },
    });
  }

  /** One chat call under a GenAI client span; the `traceparent` header makes the gateway's span its child. */
  private async chat(messages: ChatCompletionMessageParam[], turn: "tool" | "answer"): Promise<ChatCompletion> {
    const sampling = this.llm.sampling_parameters;
    const budget = typeof sampling.max_tokens === "number" ? sampling.max_tokens : undefined;
    const maxTokens = turn === "answer" ? Math.min(budget ?? Infinity, this.answerMaxTokens) : budget;
    const span = this.tracing.startSpan(
      this.ids,
      `chat ${this.llm.model}`,
      { [semconv.GEN_AI_OPERATION_NAME]: "chat", [semconv.GEN_AI_REQUEST_MODEL]: this.llm.model },
      { kind: SpanKind.CLIENT },
    );
    const headers: Record<string, string> = {};
    propagation.inject(trace.setSpan(context.active(), span), headers);
    try {
      const reply = await this.client.chat.completions.create(
        {
          model: this.llm.model,
          messages,
          // The first turn must call the calculator (the gateway constrains the answer to one tool call); the
          // answer turn must not. Both declare the tool: the chat template renders the tools into the prompt, so
          // the second prompt then extends the first prompt + answer and both calls merge into one sample.
          tools: [CALCULATE_TOOL],
          tool_choice: turn === "tool" ? ("required" as const) : ("none" as const),
          parallel_tool_calls: false,
          ...(typeof sampling.temperature === "number" ? { temperature: sampling.temperature } : {}),
          ...(maxTokens !== undefined ? { max_tokens: maxTokens } : {}),
        },
        { headers },
      );
      const choice = reply.choices[0];
      span.setAttributes({
        [semconv.GEN_AI_RESPONSE_ID]: reply.id,
        [semconv.GEN_AI_RESPONSE_FINISH_REASONS]: choice ? [choice.finish_reason] : [],
        ...(reply.usage
          ? {
              [semconv.GEN_AI_USAGE_INPUT_TOKENS]: reply.usage.prompt_tokens,
              [semconv.GEN_AI_USAGE_OUTPUT_TOKENS]: reply.usage.completion_tokens,
            }
          : {}),
      });
      log({
        event: "llm_call",
        turn,
        rollout_id: this.ids.rolloutId,
        attempt_id: this.ids.attemptId,
        response_id: reply.id,
        content: choice?.message.content ?? null,
        tool_calls: (choice?.message.tool_calls ?? []).flatMap((c) =>
          c.type === "function" ? [{ name: c.function.name, arguments: c.function.arguments }] : [],
        ),
        finish_reason: choice?.finish_reason ?? null,
      });
      return reply;
    } catch (error) {
      span.recordException(error as Error);
      span.setStatus({ code: SpanStatusCode.ERROR, message: String(error) });
      throw error;
    } finally {
      span.end();
    }
  }

  /** Execute one `calculate` call under an `execute_tool` span (status ERROR when the expression is bad). */
  private tool(callId: string, name: string, rawArguments: string): string {
    const span = this.tracing.startSpan(this.ids, `execute_tool ${name}`, {
      [semconv.GEN_AI_OPERATION_NAME]: "execute_tool",
      [semconv.GEN_AI_TOOL_NAME]: name,
      [semconv.GEN_AI_TOOL_CALL_ID]: callId,
      "tool.arguments": rawArguments,
    });
    try {
      if (name !== CALCULATE_TOOL.function.name) throw new Error(`unknown tool ${name}; the only tool is calculate`);
      const parsed = JSON.parse(rawArguments) as { expression?: unknown };
      if (typeof parsed?.expression !== "string") throw new Error('the arguments need a string field "expression"');
      const result = formatNumber(calculate(parsed.expression));
      span.setAttribute("tool.result", result);
      return result;
    } catch (error) {
      const message = `Error: ${(error as Error).message}`;
      span.setStatus({ code: SpanStatusCode.ERROR, message });
      return message;
    } finally {
      span.end();
    }
  }

  /** Ask, run the tool calls of the first reply (one round), ask again, and score the final reply. */
  async run(task: CalcTask): Promise<Outcome> {
    const messages: ChatCompletionMessageParam[] = [
      { role: "system", content: SYSTEM_PROMPT },
      { role: "user", content: task.question },
    ];
    const first = (await this.chat(messages, "tool")).choices[0]?.message;
    let reply = first?.content ?? "";
    const calls = (first?.tool_calls ?? []).filter((c) => c.type === "function");
    if (first && calls.length > 0) {
      messages.push({ role: "assistant", content: first.content ?? null, tool_calls: calls });
      for (const call of calls) {
        const result = this.tool(call.id, call.function.name, call.function.arguments);
        messages.push({ role: "tool", tool_call_id: call.id, content: toolMessage(result) });
      }
      await this.tracing.flush(); // the tool spans are filed before the next call (see tracing.ts, "Order")
      reply = (await this.chat(messages, "answer")).choices[0]?.message.content ?? "";
    }
    const gold = Number(String(task.answer).replace(/,/g, ""));
    const reward = Number.isFinite(gold) && containsNumber(reply, gold) ? 1.0 : 0.0;
    const rewardSpan = this.tracing.startSpan(this.ids, semconv.SPAN_REWARD, {
      [semconv.REWARD_VALUE]: reward,
      [semconv.REWARD_ANSWER]: reply,
    });
    rewardSpan.end();
    return { reward, reply, toolCalls: calls.length };
  }
}

/** Run one claimed attempt to its end state; never throws for the agent's errors (they fail the attempt). */
async function runAttempt(
  store: StoreClient,
  tracing: AttemptTracing,
  options: Options,
  claimed: AttemptedRollout,
): Promise<void> {
  const { rollout, attempt } = claimed;
  const ids: AttemptIds = { rolloutId: rollout.rollout_id, attemptId: attempt.attempt_id };
  const beat = setInterval(() => {
    store
      .heartbeat(options.workerId, ids)
      .catch((error: unknown) => console.error(`heartbeat failed: ${String(error)}`));
  }, options.heartbeatIntervalS * 1000);
  const root = tracing.startSpan(ids, "agent.run", {
    [semconv.AGENT_NAME]: AGENT_NAME,
    "agent.worker_id": options.workerId,
  });
  try {
    const update = await store.resources(attempt.resources_id ?? rollout.resources_id);
    if (update === null)
      throw new Error("the store has no resources version; the trainer publishes one before enqueuing");
    const llm = llmOf(update.resources);
    const task = parseTask(rollout.input);
    root.setAttribute("agent.task.question", task.question);
    await store.setStatus(ids.rolloutId, ids.attemptId, "running");
    const outcome = await tracing.withSpan(root, () => new Episode(ids, llm, tracing, options).run(task));
    root.setAttribute("agent.reward", outcome.reward);
    root.end();
    await tracing.flush(); // every span of the attempt is stored before the attempt is reported finished
    await store.setStatus(ids.rolloutId, ids.attemptId, "succeeded", { finalReward: outcome.reward });
    stats.succeeded += 1;
    log({ event: "attempt", status: "succeeded", rollout_id: ids.rolloutId, attempt_id: ids.attemptId, ...outcome });
  } catch (error) {
    const err = error instanceof Error ? error : new Error(String(error));
    // as the Python runner's emit_exception: an agentbolt.exception span (the adapter counts it), under agent.run
    const failure = tracing.startSpan(
      ids,
      semconv.SPAN_EXCEPTION,
      {
        [semconv.EXCEPTION_TYPE]: err.name,
        [semconv.EXCEPTION_MESSAGE]: err.message,
        ...(err.stack ? { [semconv.EXCEPTION_STACKTRACE]: err.stack } : {}),
      },
      { parent: root },
    );
    failure.end();
    root.recordException(err);
    root.setStatus({ code: SpanStatusCode.ERROR, message: err.message });
    root.end();
    await tracing.flush().catch(() => undefined);
    stats.failed += 1;
    log({
      event: "attempt",
      status: "failed",
      rollout_id: ids.rolloutId,
      attempt_id: ids.attemptId,
      error: err.message,
    });
    try {
      const report = { type: err.name, message: err.message, ...(err.stack ? { traceback: err.stack } : {}) };
      await store.setStatus(ids.rolloutId, ids.attemptId, "failed", { error: report });
    } catch (reportError) {
      console.error(`could not report the failure of ${ids.attemptId}: ${String(reportError)}`);
    }
  } finally {
    clearInterval(beat);
  }
}

/** One slot: claim, run, repeat; ends after `idlePolls` empty claims in a row (or on SIGINT/SIGTERM). */
async function slotLoop(store: StoreClient, tracing: AttemptTracing, options: Options): Promise<void> {
  let idle = 0;
  while (!stopping && idle < options.idlePolls) {
    const claimed = await store.claim(options.workerId);
    if (claimed === null) {
      idle += 1;
      await sleep(options.pollIntervalS);
      continue;
    }
    idle = 0;
    await runAttempt(store, tracing, options, claimed);
  }
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      server: { type: "string" },
      token: { type: "string" },
      "worker-id": { type: "string" },
      concurrency: { type: "string", default: "1" },
      "idle-polls": { type: "string", default: "3" },
      "poll-interval-s": { type: "string", default: "0.5" },
      "heartbeat-interval-s": { type: "string", default: "2" },
      "llm-timeout-s": { type: "string", default: "300" },
      "answer-max-tokens": { type: "string", default: "32" },
    },
  });
  const server = values.server ?? process.env.AGENTBOLT_SERVER;
  if (!server) throw new Error("pass --server URL (the agentbolt server's root URL) or set AGENTBOLT_SERVER");
  const number = (name: string, raw: string | undefined, min: number): number => {
    const value = Number(raw);
    if (!Number.isFinite(value) || value < min) throw new Error(`--${name} must be a number >= ${min}, got ${raw}`);
    return value;
  };
  return {
    server: server.replace(/\/+$/, ""),
    token: values.token ?? process.env.AGENTBOLT_TOKEN,
    workerId: values["worker-id"] ?? `ts-runner-${hostname()}-${process.pid}`,
    concurrency: Math.floor(number("concurrency", values.concurrency, 1)),
    idlePolls: Math.floor(number("idle-polls", values["idle-polls"], 1)),
    pollIntervalS: number("poll-interval-s", values["poll-interval-s"], 0),
    heartbeatIntervalS: number("heartbeat-interval-s", values["heartbeat-interval-s"], 0.1),
    llmTimeoutS: number("llm-timeout-s", values["llm-timeout-s"], 1),
    answerMaxTokens: Math.floor(number("answer-max-tokens", values["answer-max-tokens"], 1)),
  };
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const store = new StoreClient(options.server, options.token);
  const tracing = new AttemptTracing(options.server, store.headers(), "agentbolt-ts-agent");
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.on(signal, () => {
      if (stopping) process.exit(130); // a second signal: stop now
      stopping = true; // no new claims; the attempts in flight finish and are reported
    });
  }
  await store.heartbeat(options.workerId);
  try {
    await Promise.all(Array.from({ length: options.concurrency }, () => slotLoop(store, tracing, options)));
  } finally {
    await tracing.shutdown();
  }
  const spans = tracing.counts();
  log({
    event: "done",
    worker_id: options.workerId,
    ...stats,
    spans_exported: spans.exported,
    spans_failed: spans.failed,
    span_error: spans.lastError ?? null,
  });
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? (error.stack ?? error.message) : String(error));
  process.exit(1);
});
