/**
 * The agentbolt server's store API (`/v1`), as much of it as a runner needs: plain `fetch`, no agentbolt SDK.
 *
 * The types mirror the JSON of `agentbolt.types` (snake_case, as the server writes it); only the fields this agent
 * reads are declared. Every call has a timeout; a 4xx/5xx answer becomes an {@link ApiError} carrying the server's
 * `{"error": {"type", "message"}}` message.
 */

/** One execution of the agent on one task (`agentbolt.types.Rollout`). */
export interface Rollout {
  rollout_id: string;
  /** The task, handed to the agent unchanged. */
  input: unknown;
  mode: "train" | "val" | "test";
  /** The resources version the rollout must run against; `null`: the latest at claim time. */
  resources_id: string | null;
  status: string;
  metadata: Record<string, unknown>;
  num_attempts: number;
  final_reward: number | null;
}

/** One try of a rollout by a runner (`agentbolt.types.Attempt`). */
export interface Attempt {
  rollout_id: string;
  attempt_id: string;
  /** 1 for the first attempt of a rollout, then 2, 3, ... */
  sequence_id: number;
  status: string;
  worker_id: string | null;
  /** The resources version the attempt was handed (set by the claim). */
  resources_id: string | null;
}

/** What `POST /v1/claims` answers: the rollout and the attempt just created for it. */
export interface AttemptedRollout {
  rollout: Rollout;
  attempt: Attempt;
}

/** An OpenAI-compatible endpoint (`agentbolt.types.LLM`); `endpoint` is the gateway root, not yet scoped. */
export interface LLMResource {
  resource_type: "llm";
  endpoint: string;
  model: string;
  /** Defaults the agent should use (`temperature`, `top_p`, `max_tokens`). */
  sampling_parameters: Record<string, unknown>;
  /** The gateway applies `sampling_parameters` whatever the request says (train and eval jobs set it). */
  sampling_enforced: boolean;
}

/** A prompt with `{placeholders}` (`agentbolt.types.PromptTemplate`). */
export interface PromptTemplateResource {
  resource_type: "prompt_template";
  template: string;
}

export type Resource = LLMResource | PromptTemplateResource;

/** One immutable resources version (`agentbolt.types.ResourcesUpdate`). */
export interface ResourcesUpdate {
  resources_id: string;
  version: number;
  resources: Record<string, Resource>;
  metadata: Record<string, unknown>;
}

/** The attempt states a runner reports (the store owns the others: `preparing`, `timeout`, `unresponsive`). */
export type ReportedStatus = "running" | "succeeded" | "failed";

/** `error` of a failed attempt, as the Python runner reports it. */
export interface AttemptError {
  type: string;
  message: string;
  traceback?: string;
}

/** A 4xx/5xx answer of the server; `status` is the HTTP status (404 unknown id, 409 illegal transition, ...). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly path: string,
    message: string,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/**
 * The gateway base URL scoped to one attempt, exactly as `agentbolt.types.LLM.for_attempt` builds it:
 * `http://host:port[/v1]` becomes `http://host:port/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1`.
 */
export function forAttempt(endpoint: string, rolloutId: string, attemptId: string): string {
  let root = endpoint.replace(/\/+$/, "");
  if (root.endsWith("/v1")) root = root.slice(0, -"/v1".length);
  return `${root}/v1/rollouts/${rolloutId}/attempts/${attemptId}/v1`;
}

/** The store API of one agentbolt server (`serverUrl`: its root, e.g. `http://127.0.0.1:8000`). */
export class StoreClient {
  readonly serverUrl: string;

  /**
   * @param serverUrl the server's root URL (a trailing `/` is dropped).
   * @param token bearer token, when the server was started with one.
   * @param timeoutMs timeout of each call, in milliseconds.
   */
  constructor(
    serverUrl: string,
    readonly token?: string,
    readonly timeoutMs = 30_000,
  ) {
    this.serverUrl = serverUrl.replace(/\/+$/, "");
  }

  /** Headers of every call (the bearer token when there is one). */
  headers(): Record<string, string> {
    return this.token ? { Authorization: `Bearer ${this.token}` } : {};
  }

  private async request<T>(method: "GET" | "POST", path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { Accept: "application/json", ...this.headers() };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(this.serverUrl + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
    const text = await response.text();
    if (!response.ok) {
      let message = text;
      try {
        const parsed = JSON.parse(text) as { error?: { message?: string } };
        message = parsed.error?.message ?? text;
      } catch {
        // not JSON: keep the text
      }
      throw new ApiError(response.status, path, `${method} ${path}: HTTP ${response.status}: ${message}`);
    }
    return JSON.parse(text) as T;
  }

  /** Lease the oldest queued rollout to `workerId` with a new attempt; `null` when the queue is empty. */
  claim(workerId: string): Promise<AttemptedRollout | null> {
    return this.request("POST", "/v1/claims", { worker_id: workerId });
  }

  /** One resources version (`null`: the latest; the answer is `null` before the first one is written). */
  resources(resourcesId: string | null): Promise<ResourcesUpdate | null> {
    const path = resourcesId === null ? "/v1/resources/latest" : `/v1/resources/${encodeURIComponent(resourcesId)}`;
    return this.request("GET", path);
  }

  /** Move an attempt to `status` (and its rollout along); 409 for an illegal transition. */
  setStatus(
    rolloutId: string,
    attemptId: string,
    status: ReportedStatus,
    extra: { finalReward?: number; error?: AttemptError } = {},
  ): Promise<Attempt> {
    const body: Record<string, unknown> = { status };
    if (extra.finalReward !== undefined) body.final_reward = extra.finalReward;
    if (extra.error !== undefined) body.error = extra.error;
    const path = `/v1/rollouts/${encodeURIComponent(rolloutId)}/attempts/${encodeURIComponent(attemptId)}/status`;
    return this.request("POST", path, body);
  }

  /** Register or refresh the worker; with an attempt, refresh that attempt's lease too. */
  heartbeat(workerId: string, attempt?: { rolloutId: string; attemptId: string }): Promise<unknown> {
    const body = attempt ? { rollout_id: attempt.rolloutId, attempt_id: attempt.attemptId } : {};
    return this.request("POST", `/v1/workers/${encodeURIComponent(workerId)}/heartbeat`, body);
  }
}
