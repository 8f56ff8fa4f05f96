// Type declarations of retryd for Node.js (lib/index.js). Times are in milliseconds.

export type Outcome = 'success' | 'failure' | 'ignored';
export type RejectionReason = 'open' | 'half_open_busy' | 'bulkhead_full' | 'budget_empty';
export type BreakerState = 'closed' | 'open' | 'half_open';
export type ErrorKind =
  'none' | 'dns' | 'connect_refused' | 'connection_reset' | 'tls' | 'timeout' | 'other';
export type AttemptClass = 'success' | 'retryable' | 'terminal';
export type Jitter = 'none' | 'full' | 'equal' | 'decorrelated';
export type StopReason =
  'success' | 'terminal' | 'attempts_exhausted' | 'rejected' | 'deadline' |
  'retry_after_too_long' | 'cancelled' | 'aborted';

export interface ClientOptions {
  /** A segment by name (default: $RETRYD_SEGMENT, else "retryd"). */
  segment?: string | null;
  /** The daemon's Unix socket (its config's `socket`; default: $RETRYD_SOCKET, else
   * /run/retryd/retryd.sock if it exists and no segment is named). */
  socket?: string | null;
  /** With no daemon answering, run on per-process limits instead of throwing (default true). */
  fallbackToLocal?: boolean;
}

export class Client {
  constructor(options?: ClientOptions);
  /** The file libretryd was loaded from. */
  static readonly libraryPath: string;
  /** True while running on per-process state (no segment on the host). */
  readonly local: boolean;
  dependency(name: string): Dependency;
  close(): void;
}

export class Dependency {
  readonly name: string;
  readonly client: Client;
  /** The breaker's state as this process sees it now. */
  readonly state: BreakerState;
  /** Throws RejectedError when the host refuses the attempt. Synchronous. */
  admit(attempt?: number): Permit;
  call<T>(fn: (attempt: Attempt) => T | Promise<T>, policy?: Policy | null,
          options?: { signal?: AbortSignal | null }): Promise<T>;
}

export class Permit {
  readonly dependency: Dependency;
  readonly attempt: number;
  /** True if this attempt is the breaker's half-open probe. */
  readonly probe: boolean;
  readonly done: boolean;
  /** Reports the attempt's outcome (default "success") and latency (default: measured since
   * the admission). A second call is a no-op. */
  complete(outcome?: Outcome, latencyMs?: number): void;
}

export class Attempt {
  /** 0 for the first attempt. */
  readonly number: number;
  /** The attempt's time, or null when unbounded. */
  readonly timeoutMs: number | null;
  readonly probe: boolean;
  /** Fires when the attempt's time is up, or the call's signal fires. */
  readonly signal: AbortSignal;
  readonly timedOut: boolean;
  /** timeoutMs in the gRPC timeout format ("800m"), or null. */
  readonly deadlineHeader: string | null;
}

export interface AttemptResultInit<T = unknown> {
  value?: T;
  status?: number;
  error?: ErrorKind | number;
  /** The Retry-After header's text, or a wait in milliseconds. */
  retryAfter?: string | number | null;
  date?: string | null;
  attemptClass?: AttemptClass | null;
  breaker?: Outcome | null;
}

export class AttemptResult<T = unknown> {
  constructor(init?: AttemptResultInit<T>);
  value: T | undefined;
  status: number;
  error: ErrorKind | number;
  retryAfter: string | number | null;
  date: string | null;
  attemptClass: AttemptClass | null;
  breaker: Outcome | null;
}

export interface AttemptInfo {
  attempt: number;
  decision: 'admitted' | 'admitted_probe' | RejectionReason;
  attemptClass: AttemptClass;
  breaker: Outcome;
  status: number;
  error: ErrorKind;
  latencyMs: number;
  retryAfterMs: number | null;
  waitMs: number;
  next: 'retry' | StopReason;
}

export interface Policy {
  /** Attempts per call, the first included (default 3). */
  maxAttempts?: number;
  jitter?: Jitter;
  baseMs?: number;
  capMs?: number;
  retryAfterJitterMs?: number;
  retryAfterMaxMs?: number;
  /** Total budget, waits included (default none). */
  deadlineMs?: number | null;
  /** Each attempt's own time, clamped to what is left of the deadline (default none). */
  attemptTimeoutMs?: number | null;
  expectedAttemptMs?: number | null;
  /** As sent; "POST" without an idempotency key fails closed on an ambiguous error. */
  method?: string;
  idempotencyKey?: boolean;
  classifier?: Classifier | null;
  inspect?: (value: any) => AttemptResult;
  classifyError?: (error: unknown, attempt: Attempt) =>
    ErrorKind | AttemptResult | null | undefined;
  observer?: ((info: AttemptInfo) => void) | null;
}

export interface CallResult<T = unknown> {
  readonly stop: StopReason;
  readonly finalClass: AttemptClass;
  readonly attempts: number;
  readonly lastStatus: number;
  readonly lastError: ErrorKind;
  readonly rejection: RejectionReason | null;
  readonly elapsedMs: number;
  readonly value: T | undefined;
  readonly error: unknown;
}

export class Classifier {
  constructor();
  setStatus(status: number, attemptClass: AttemptClass, breaker: Outcome,
            retryUnsafe?: boolean): this;
  setError(error: Exclude<ErrorKind, 'none'>, attemptClass: AttemptClass, breaker: Outcome,
           retryUnsafe?: boolean): this;
  setIdempotent(method: string, idempotent?: boolean): this;
}

export class RetrydError extends Error {}
export class LibraryNotFoundError extends RetrydError {}
export class ClientError extends RetrydError {
  readonly code: number;
}
export class RejectedError extends RetrydError {
  readonly reason: RejectionReason;
  readonly dependency: string | null;
  readonly result: CallResult | null;
}
export class CallFailedError extends RetrydError {
  readonly dependency: string;
  readonly result: CallResult;
}

export function defaultInspect(value: unknown): AttemptResult;
export function defaultClassifyError(error: unknown): ErrorKind | AttemptResult | null;
export const DEFAULT_POLICY: Readonly<Required<Policy>>;
export const constants: Readonly<Record<string, number>>;

export interface AdapterOptions {
  /** Headers whose presence gives a request an idempotency key. */
  idempotencyHeaders?: string[] | null;
  /** The header that carries each attempt's time downstream (null: none). */
  deadlineHeader?: string | null;
}

export namespace adapters {
  /** A function with fetch's signature whose every request runs in `dep`'s retry loop. */
  function fetch(dep: Dependency, policy?: Policy | null,
                 options?: AdapterOptions & { fetch?: typeof globalThis.fetch }):
    (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;
  /** An axios adapter (config.adapter) whose every request runs in `dep`'s retry loop. */
  function axios(axios: any, dep: Dependency, policy?: Policy | null,
                 options?: AdapterOptions & { adapter?: any }): (config: any) => Promise<any>;
  const DEFAULT_IDEMPOTENCY_HEADERS: readonly string[];
  const DEFAULT_DEADLINE_HEADER: string;
}
