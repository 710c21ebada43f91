/**
 * The agent's own OpenTelemetry spans, exported to the agentbolt server over OTLP/HTTP (`POST {server}/v1/traces`,
 * OTLP/JSON) by the stock exporter.
 *
 * Attribution: the server files a span under the attempt named by its `agentbolt.rollout_id` and
 * `agentbolt.attempt_id` attributes (span attributes first, then resource attributes). One runner process serves
 * many attempts with one tracer provider, so the ids go on every span, not on the resource:
 * {@link AttemptTracing.startSpan} adds them.
 *
 * Order: the store numbers spans in the order they *arrive*, and the adapter reads that order (a reward attaches to
 * the last LLM call recorded before it; a tool call counts for the call before it). The gateway records each LLM
 * call as soon as it is answered, so the agent flushes its spans ({@link AttemptTracing.flush}) after its tool calls,
 * before the next LLM call, and before it reports the attempt finished; a batch exporter left to its own 5 s timer
 * would file every tool and reward span after the last call.
 */

import { type Attributes, context, type Span, type SpanKind, trace } from "@opentelemetry/api";
import { ExportResultCode, type ExportResult } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import {
  BatchSpanProcessor,
  NodeTracerProvider,
  type ReadableSpan,
  type SpanExporter,
} from "@opentelemetry/sdk-trace-node";

/** Attribute keys of `agentbolt.semconv` this agent writes. */
export const semconv = {
  ROLLOUT_ID: "agentbolt.rollout_id",
  ATTEMPT_ID: "agentbolt.attempt_id",
  SPAN_REWARD: "agentbolt.reward",
  REWARD_VALUE: "agentbolt.reward.value",
  REWARD_NAME: "agentbolt.reward.name",
  REWARD_ANSWER: "agentbolt.reward.answer",
  SPAN_EXCEPTION: "agentbolt.exception",
  EXCEPTION_TYPE: "exception.type",
  EXCEPTION_MESSAGE: "exception.message",
  EXCEPTION_STACKTRACE: "exception.stacktrace",
  AGENT_NAME: "agentbolt.agent.name",
  AGENT_NAME_HEADER: "x-agentbolt-agent",
  GEN_AI_OPERATION_NAME: "gen_ai.operation.name",
  GEN_AI_REQUEST_MODEL: "gen_ai.request.model",
  GEN_AI_RESPONSE_ID: "gen_ai.response.id",
  GEN_AI_RESPONSE_FINISH_REASONS: "gen_ai.response.finish_reasons",
  GEN_AI_USAGE_INPUT_TOKENS: "gen_ai.usage.input_tokens",
  GEN_AI_USAGE_OUTPUT_TOKENS: "gen_ai.usage.output_tokens",
  GEN_AI_TOOL_NAME: "gen_ai.tool.name",
  GEN_AI_TOOL_CALL_ID: "gen_ai.tool.call.id",
} as const;

/** The ids of the attempt a span belongs to. */
export interface AttemptIds {
  rolloutId: string;
  attemptId: string;
}

/** Passes spans to the OTLP exporter and counts those it could not deliver (the server refused them, or is down). */
class CountingExporter implements SpanExporter {
  exported = 0;
  failed = 0;
  lastError: string | undefined;

  constructor(private readonly inner: SpanExporter) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.inner.export(spans, (result) => {
      if (result.code === ExportResultCode.SUCCESS) {
        this.exported += spans.length;
      } else {
        this.failed += spans.length;
        this.lastError = result.error?.message ?? "export failed";
      }
      done(result);
    });
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

/** One tracer provider for the runner process, exporting to `{serverUrl}/v1/traces`. */
export class AttemptTracing {
  private readonly provider: NodeTracerProvider;
  private readonly exporter: CountingExporter;
  private readonly tracer;

  /**
   * @param serverUrl the agentbolt server's root URL.
   * @param headers extra export headers (the bearer token, when the server has one).
   * @param serviceName `service.name` of the resource.
   */
  constructor(serverUrl: string, headers: Record<string, string>, serviceName: string) {
    this.exporter = new CountingExporter(
      new OTLPTraceExporter({ url: `${serverUrl}/v1/traces`, headers, timeoutMillis: 30_000 }),
    );
    this.provider = new NodeTracerProvider({
      resource: resourceFromAttributes({ "service.name": serviceName }),
      spanProcessors: [new BatchSpanProcessor(this.exporter)],
    });
    // The async-hooks context manager (the active span follows `await`) and the W3C trace-context propagator.
    this.provider.register();
    this.tracer = this.provider.getTracer(serviceName);
  }

  /**
   * Start a span of attempt `ids` with the attribution attributes: a child of `options.parent`, else of the active
   * span (if any).
   */
  startSpan(
    ids: AttemptIds,
    name: string,
    attributes: Attributes = {},
    options: { kind?: SpanKind; parent?: Span } = {},
  ): Span {
    const parent = options.parent ? trace.setSpan(context.active(), options.parent) : undefined;
    const all = { ...attributes, [semconv.ROLLOUT_ID]: ids.rolloutId, [semconv.ATTEMPT_ID]: ids.attemptId };
    return this.tracer.startSpan(name, { kind: options.kind, attributes: all }, parent);
  }

  /** Run `fn` with `span` as the active span (its children, and the `traceparent` header, point at it). */
  withSpan<T>(span: Span, fn: () => Promise<T>): Promise<T> {
    return context.with(trace.setSpan(context.active(), span), fn);
  }

  /** Export every ended span now; resolves when the server has answered. */
  flush(): Promise<void> {
    return this.provider.forceFlush();
  }

  /** Spans the server acknowledged, and spans that could not be delivered (with the last error). */
  counts(): { exported: number; failed: number; lastError: string | undefined } {
    return { exported: this.exporter.exported, failed: this.exporter.failed, lastError: this.exporter.lastError };
  }

  /** Flush and stop the exporter. */
  shutdown(): Promise<void> {
    return this.provider.shutdown();
  }
}
