'use strict';
// Client, Dependency and Permit over the addon, and the retry loop (dep.call) driven by the C
// library's steps (retryd_steps_*: it decides, admits, classifies and reports; the waits are
// timers here, so a call never blocks the event loop).

const timers = require('timers/promises');
const native = require('./native');
const C = require('./constants');
const {
  ClientError, LibraryNotFoundError, RejectedError, CallFailedError, RetrydError,
} = require('./errors');
const P = require('./policy');

const REASONS = Object.freeze({
  [C.ADMITTED]: 'admitted',
  [C.ADMITTED_PROBE]: 'admitted_probe',
  [C.REJECTED_OPEN]: 'open',
  [C.REJECTED_HALF_OPEN_BUSY]: 'half_open_busy',
  [C.REJECTED_BULKHEAD_FULL]: 'bulkhead_full',
  [C.REJECTED_BUDGET_EMPTY]: 'budget_empty',
});
const STATES = Object.freeze({
  [C.STATE_CLOSED]: 'closed', [C.STATE_OPEN]: 'open', [C.STATE_HALF_OPEN]: 'half_open',
});
const STOPS = Object.freeze({
  [C.STOP_NONE]: 'retry',
  [C.STOP_SUCCESS]: 'success',
  [C.STOP_TERMINAL]: 'terminal',
  [C.STOP_ATTEMPTS_EXHAUSTED]: 'attempts_exhausted',
  [C.STOP_REJECTED]: 'rejected',
  [C.STOP_DEADLINE]: 'deadline',
  [C.STOP_RETRY_AFTER_TOO_LONG]: 'retry_after_too_long',
  [C.STOP_CANCELLED]: 'cancelled',
  [C.STOP_ABORTED]: 'aborted',
});
const CLIENT_OPTIONS = ['segment', 'socket', 'fallbackToLocal'];

// The addon's shared buffers: read right after the native call that filled them, before any
// await lets another call on this thread use them.
const permitWords = native.permit;
const step = native.step;

function closedError() {
  return new RetrydError('retryd client is closed');
}

/** A connection to the host's retryd segment.
 *
 * new Client({segment, socket, fallbackToLocal = true}): `socket` is the daemon's Unix socket
 * (its config's `socket`). With neither named, the client attaches through $RETRYD_SOCKET if
 * set; else, with $RETRYD_SEGMENT unset, through /run/retryd/retryd.sock if it exists (the
 * packaged daemon's); else it maps the segment $RETRYD_SEGMENT, or "retryd", by name. With no
 * daemon answering (no segment by name) and `fallbackToLocal`, the client runs on per-process
 * state with the default policy (and says so once on stderr) and moves to the host's limits
 * once the daemon answers; without it, ClientError is thrown. A daemon that refuses this
 * process throws ClientError (EPERM) with its reason either way.
 *
 * One per process (per worker of a cluster), made at start-up: it registers the process with
 * the daemon, which gives back the process's leases when it dies. close() unregisters it; a
 * call in progress keeps it open until it ends. */
class Client {
  constructor(options = {}) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('Client options must be an object');
    }
    for (const key of Object.keys(options)) {
      if (!CLIENT_OPTIONS.includes(key)) {
        throw new TypeError(`Client: unknown option ${key} (known: ${CLIENT_OPTIONS.join(', ')})`);
      }
    }
    const { segment = null, socket = null, fallbackToLocal = true } = options;
    for (const [key, v] of [['segment', segment], ['socket', socket]]) {
      if (v != null && typeof v !== 'string') {
        throw new TypeError(`Client: ${key} must be a string`);
      }
    }
    const why = native.load();
    if (why) throw new LibraryNotFoundError(why);
    const handle = native.open(segment || null, socket || null, Boolean(fallbackToLocal));
    if (typeof handle === 'number') throw new ClientError(handle, native.lastError());
    this._handle = handle;
    this._closed = false;
    this._deps = new Map();
  }

  /** The file libretryd was loaded from. */
  static get libraryPath() {
    const why = native.load();
    if (why) throw new LibraryNotFoundError(why);
    return native.libraryPath();
  }

  /** True while running on per-process state (no segment on the host). */
  get local() {
    const v = native.isLocal(this._handle);
    if (v === native.CLOSED) throw closedError();
    return v === 1;
  }

  /** The Dependency `name` (resolved once, then cached). Throws ClientError (EINVAL) for a
   * bad name, with the library's message saying what a name may be. */
  dependency(name) {
    if (typeof name !== 'string') throw new TypeError('dependency name must be a string');
    let dep = this._deps.get(name);
    if (dep === undefined) {
      const rc = native.resolve(this._handle, name);
      if (rc === native.CLOSED) throw closedError();
      if (rc !== C.OK) throw new ClientError(rc, native.lastError());
      dep = new Dependency(this, name, permitWords[0]);
      this._deps.set(name, dep);
    }
    return dep;
  }

  /** Unregisters this process (now, or when the last call in progress ends). Idempotent. */
  close() {
    if (!this._closed) {
      this._closed = true;
      native.close(this._handle);
    }
  }
}

/** An admitted attempt, from dep.admit(). Report how it ended exactly once with complete(). */
class Permit {
  constructor(dep, attempt, decision) {
    this.dependency = dep;
    this.attempt = attempt;
    /** True if this attempt is the breaker's half-open probe. */
    this.probe = decision === C.ADMITTED_PROBE;
    this._done = false;
    // The C permit (12 words) and the admission's time (2 words), copied out of the shared
    // buffer: plain values the library keeps no pointer to.
    const w = permitWords;
    this._w0 = w[0]; this._w1 = w[1]; this._w2 = w[2]; this._w3 = w[3]; this._w4 = w[4];
    this._w5 = w[5]; this._w6 = w[6]; this._w7 = w[7]; this._w8 = w[8]; this._w9 = w[9];
    this._w10 = w[10]; this._w11 = w[11]; this._w12 = w[12]; this._w13 = w[13];
  }

  /** True once complete() has reported it. */
  get done() {
    return this._done;
  }

  /** complete(outcome = "success", latencyMs) reports how the attempt ended: "success",
   * "failure" (counts toward the breaker) or "ignored" (the caller's fault, a 4xx: the breaker
   * does not see it), and how long it took (default: the time since the admission). A second
   * call is a no-op. */
  complete(outcome = 'success', latencyMs = -1) {
    if (this._done) return;
    const code = P.outcomeCode(outcome);
    if (typeof latencyMs !== 'number' || Number.isNaN(latencyMs)) {
      throw new TypeError(`latencyMs must be a number, got ${latencyMs}`);
    }
    const w = permitWords;
    w[0] = this._w0; w[1] = this._w1; w[2] = this._w2; w[3] = this._w3; w[4] = this._w4;
    w[5] = this._w5; w[6] = this._w6; w[7] = this._w7; w[8] = this._w8; w[9] = this._w9;
    w[10] = this._w10; w[11] = this._w11; w[12] = this._w12; w[13] = this._w13;
    if (native.complete(this.dependency._client._handle, code, latencyMs) === native.CLOSED) {
      throw closedError();
    }
    this._done = true;
  }
}

/** What the attempt function is told: its number (0 for the first attempt), the time it has
 * (`timeoutMs`, null when unbounded), whether it is the half-open probe, and an AbortSignal
 * that fires when that time is up (or the call's signal fires): pass it to fetch or axios. */
class Attempt {
  constructor(number, timeoutMs, probe, callSignal) {
    this.number = number;
    this.timeoutMs = timeoutMs;
    this.probe = probe;
    this._callSignal = callSignal;
    this._signal = null;
    this._timeoutSignal = null;
  }

  get signal() {
    if (this._signal === null) {
      const signals = [];
      if (this.timeoutMs !== null) {
        this._timeoutSignal = AbortSignal.timeout(Math.max(1, Math.ceil(this.timeoutMs)));
        signals.push(this._timeoutSignal);
      }
      if (this._callSignal) signals.push(this._callSignal);
      this._signal = signals.length === 0 ? new AbortController().signal
        : signals.length === 1 ? signals[0] : AbortSignal.any(signals);
    }
    return this._signal;
  }

  /** True if the attempt's own time ran out (its signal fired for that). */
  get timedOut() {
    return this._timeoutSignal !== null && this._timeoutSignal.aborted;
  }

  /** The attempt's time in the gRPC timeout format ("800m"), to send downstream as
   * `grpc-timeout`; null when unbounded. */
  get deadlineHeader() {
    return this.timeoutMs === null ? null : native.formatDeadlineHeader(this.timeoutMs);
  }
}

function readRecord() {
  const s = step;
  return {
    attempt: s[5],
    decision: REASONS[s[6]] || String(s[6]),
    attemptClass: P.CLASS_NAMES[s[7]] || String(s[7]),
    breaker: P.OUTCOME_NAMES[s[8]] || String(s[8]),
    status: s[9],
    error: P.ERROR_NAMES[s[10]] || String(s[10]),
    latencyMs: s[11] / 1e6,
    retryAfterMs: s[12] < 0 ? null : s[12] / 1e6,
    waitMs: s[13] / 1e6,
    next: STOPS[s[14]] || String(s[14]),
  };
}

/** The native report of an AttemptResult: [status, errorKind, retryAfterMs, retryAfter, date,
 * attemptClass, breaker]. */
function reportOf(res) {
  let errorKind = res.error == null ? C.ERROR_NONE
    : typeof res.error === 'number' ? res.error : P.ERROR_KINDS[res.error];
  if (errorKind === undefined) throw new TypeError(`unknown error kind ${res.error}`);
  let retryAfterMs = -1;
  let retryAfter = null;
  if (typeof res.retryAfter === 'number') {
    retryAfterMs = Math.max(0, Math.round(res.retryAfter));
  } else if (res.retryAfter != null) {
    retryAfter = String(res.retryAfter);
  }
  let attemptClass = -1;
  let breaker = 0;
  if (res.attemptClass != null) {
    attemptClass = P.CLASSES[res.attemptClass];
    if (attemptClass === undefined) {
      throw new TypeError(`unknown attempt class ${res.attemptClass}`);
    }
    const implied = res.attemptClass === 'success' ? 'success' : 'failure';
    breaker = P.outcomeCode(res.breaker || implied);
  }
  const status = Number.isInteger(res.status) ? res.status : 0;
  return [status, errorKind, retryAfterMs, retryAfter, res.date == null ? null : String(res.date),
          attemptClass, breaker];
}

const NO_REPORT = [0, C.ERROR_NONE, -1, null, null, -1, 0];

/** A downstream dependency, from client.dependency(name). */
class Dependency {
  constructor(client, name, id) {
    this._client = client;
    this._id = id;
    this.name = name;
  }

  get client() {
    return this._client;
  }

  /** The breaker's state as this process sees it now: "closed", "open" or "half_open" (a
   * breaker whose open period has ended reads "open" until the next admission). */
  get state() {
    const s = native.breakerState(this._client._handle, this._id);
    if (s === native.CLOSED) throw closedError();
    if (s < 0) throw new RetrydError(`${this.name}: ${native.lastError()}`);
    return STATES[s] || String(s);
  }

  /** admit(attempt = 0) asks whether attempt number `attempt` (0: first attempt, 1: first
   * retry...) may go out now. Returns a Permit, to complete() exactly once, or throws
   * RejectedError with the reason. Synchronous: a few atomic instructions on the segment. */
  admit(attempt = 0) {
    if (!Number.isInteger(attempt) || attempt < 0 || attempt > 0xffffffff) {
      throw new TypeError(`attempt must be an integer >= 0, got ${attempt}`);
    }
    const decision = native.admit(this._client._handle, this._id, attempt);
    if (decision === C.ADMITTED || decision === C.ADMITTED_PROBE) {
      return new Permit(this, attempt, decision);
    }
    if (decision === native.CLOSED) throw closedError();
    if (decision < 0) throw new RetrydError(`${this.name}: invalid dependency handle`);
    throw new RejectedError(REASONS[decision] || String(decision), this.name);
  }

  /** call(fn, policy, {signal}) calls `await fn(attempt)` under the retry policy and resolves
   * to its value.
   *
   * Each attempt is admitted by the host, `fn` is called with an Attempt (its number, its
   * timeout and a signal for it), its value or error is classified (policy.inspect,
   * policy.classifyError) and reported, and the call is retried after backoff with jitter, or
   * the server's Retry-After, while the policy, the host's retry budget and the deadline allow.
   * The waits are timers: the event loop runs on meanwhile. `signal` (an AbortSignal) cancels
   * the call: an attempt in flight is reported as ignored, and the call rejects with the
   * signal's reason.
   *
   * Rejects with RejectedError when an attempt is not admitted (serve a fallback),
   * CallFailedError when the call gives up, and an error the policy does not map (a bug in
   * fn, say) as it is, after reporting that attempt as a failure and without retrying. */
  async call(fn, policy = null, { signal = null } = {}) {
    if (typeof fn !== 'function') throw new TypeError('dep.call: fn must be a function');
    if (signal != null && !(signal instanceof AbortSignal)) {
      throw new TypeError('dep.call: signal must be an AbortSignal');
    }
    const p = P.normalizePolicy(policy);
    const handle = native.stepsBegin(this._client._handle, this._id, ...P.nativePolicy(p));
    if (handle === native.CLOSED) throw closedError();
    if (typeof handle === 'number') {
      throw new RetrydError(`${this.name}: retryd_steps_begin failed: ${native.strerror(handle)} ` +
                            '(check the policy)');
    }
    let value;
    let error;
    let hasError = false;
    let lateError;        // from the observer: thrown once the call has ended
    let cancelled = false;
    const observe = () => {
      if (p.observer === null || step[4] === 0 || lateError !== undefined) return;
      try {
        p.observer(readRecord());
      } catch (e) {
        lateError = e;
      }
    };
    try {
      for (;;) {
        if (signal !== null && signal.aborted) {
          native.stepsCancel(handle, C.IGNORED);
          cancelled = true;
          break;
        }
        let code = native.stepsAdmit(handle);
        const number = step[0];
        const probe = step[1] === 1;
        const timeoutMs = step[2] < 0 ? null : step[2];
        observe();
        if (code !== C.STEP_ATTEMPT) break;

        const attempt = new Attempt(number, timeoutMs, probe, signal);
        let report = NO_REPORT;
        let abort = false;
        try {
          const v = await fn(attempt);
          hasError = false;
          error = undefined;
          const res = p.inspect(v);
          value = res.value;
          report = reportOf(res);
        } catch (e) {
          if (signal !== null && signal.aborted) {
            // The caller gave up: that says nothing about the dependency.
            native.stepsCancel(handle, C.IGNORED);
            cancelled = true;
            value = undefined;
            error = e;
            hasError = true;
            break;
          }
          value = undefined;
          error = e;
          hasError = true;
          try {
            let mapped = p.classifyError(e, attempt);
            if (mapped == null && attempt.timedOut) mapped = 'timeout';
            if (mapped == null) {
              abort = true;
            } else if (mapped instanceof P.AttemptResult) {
              value = mapped.value;
              report = reportOf(mapped);
            } else {
              report = reportOf({ error: mapped });
            }
          } catch (inner) {
            error = inner;
            abort = true;
          }
        }
        code = native.stepsReport(handle, ...report, abort);
        const waitMs = step[3] / 1e6;
        observe();
        if (code !== C.STEP_WAIT) break;
        try {
          await timers.setTimeout(waitMs, undefined, signal !== null ? { signal } : undefined);
        } catch (e) {
          if (signal === null || !signal.aborted) throw e;
          native.stepsCancel(handle, C.IGNORED);
          cancelled = true;
          break;
        }
      }
    } finally {
      native.stepsEnd(handle);
    }
    const stop = step[0];
    const result = Object.freeze({
      stop: STOPS[stop] || String(stop),
      finalClass: P.CLASS_NAMES[step[1]] || String(step[1]),
      attempts: step[2],
      lastStatus: step[3],
      lastError: P.ERROR_NAMES[step[4]] || String(step[4]),
      rejection: stop === C.STOP_REJECTED ? (REASONS[step[5]] || String(step[5])) : null,
      elapsedMs: step[6] / 1e6,
      value,
      error,
    });
    if (lateError !== undefined) throw lateError;
    if (cancelled && signal !== null && signal.aborted) throw signal.reason;
    if (stop === C.STOP_SUCCESS) return value;
    if (stop === C.STOP_ABORTED && hasError) throw error;
    if (stop === C.STOP_REJECTED) {
      throw new RejectedError(result.rejection, this.name, result,
                              hasError ? { cause: error } : undefined);
    }
    throw new CallFailedError(this.name, result);
  }
}

module.exports = { Client, Dependency, Permit, Attempt, REASONS, STATES, STOPS };
