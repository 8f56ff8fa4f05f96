'use strict';
// The retry policy of dep.call, and how JavaScript results and errors map onto the
// classification inputs of the C library (method, status, transport error kind).

const C = require('./constants');
const { LibraryNotFoundError } = require('./errors');

const ERROR_KINDS = Object.freeze({
  none: C.ERROR_NONE,
  dns: C.ERROR_DNS,
  connect_refused: C.ERROR_CONNECT_REFUSED,
  connection_reset: C.ERROR_CONNECTION_RESET,
  tls: C.ERROR_TLS,
  timeout: C.ERROR_TIMEOUT,
  other: C.ERROR_OTHER,
});
const CLASSES = Object.freeze({
  success: C.ATTEMPT_SUCCESS, retryable: C.ATTEMPT_RETRYABLE, terminal: C.ATTEMPT_TERMINAL,
});
const OUTCOMES = Object.freeze({ success: C.SUCCESS, failure: C.FAILURE, ignored: C.IGNORED });
const JITTERS = Object.freeze({
  none: C.JITTER_NONE, full: C.JITTER_FULL, equal: C.JITTER_EQUAL,
  decorrelated: C.JITTER_DECORRELATED,
});

function invert(table) {
  const out = {};
  for (const [k, v] of Object.entries(table)) out[v] = k;
  return Object.freeze(out);
}
const ERROR_NAMES = invert(ERROR_KINDS);
const CLASS_NAMES = invert(CLASSES);
const OUTCOME_NAMES = invert(OUTCOMES);

/** What one attempt reports, when its plain value does not say it. Return one from the attempt
 * function (or from policy.inspect) to give the status, the transport error, the server's
 * Retry-After and Date headers, or a classification of your own; `value` is what dep.call
 * returns on success. */
class AttemptResult {
  constructor({ value, status = 0, error = 'none', retryAfter = null, date = null,
                attemptClass = null, breaker = null } = {}) {
    this.value = value;
    this.status = status;              // HTTP status; 0 when no response arrived
    this.error = error;                // a transport error kind (ERROR_KINDS)
    this.retryAfter = retryAfter;      // the header's text, or milliseconds
    this.date = date;                  // the response's Date header
    this.attemptClass = attemptClass;  // "success", "retryable", "terminal": overrides
    this.breaker = breaker;            // with attemptClass: "success", "failure", "ignored"
  }
}

/** A header's value from fetch's Headers, axios's AxiosHeaders, or a plain object of
 * lower-cased names (node:http); null if absent. */
function header(headers, name) {
  if (headers == null || typeof headers !== 'object') return null;
  let value;
  if (typeof headers.get === 'function') {
    value = headers.get(name);
  } else {
    value = headers[name.toLowerCase()];
    if (value === undefined) value = headers[name];
  }
  if (value == null || value === false) return null;
  return Array.isArray(value) ? String(value[0]) : String(value);
}

function responseStatus(value) {
  if (value == null || typeof value !== 'object') return null;
  for (const key of ['status', 'statusCode']) {
    const s = value[key];
    if (Number.isInteger(s)) return s;
  }
  return null;
}

function fromResponse(value, response) {
  const status = responseStatus(response);
  return new AttemptResult({
    value, status,
    retryAfter: header(response.headers, 'Retry-After'),
    date: header(response.headers, 'Date'),
  });
}

/** Maps an attempt's value to an AttemptResult. An AttemptResult is taken as is. An object with
 * an integer `status` or `statusCode` (fetch's Response, axios's response, node:http's
 * IncomingMessage) is an HTTP response, whose headers give Retry-After and Date. Anything else
 * is a success. */
function defaultInspect(value) {
  if (value instanceof AttemptResult) return value;
  if (responseStatus(value) !== null) return fromResponse(value, value);
  return new AttemptResult({ value, attemptClass: 'success', breaker: 'success' });
}

const DNS_CODES = new Set(['ENOTFOUND', 'EAI_AGAIN', 'EAI_FAIL', 'EAI_NONAME', 'EAI_NODATA']);
const RESET_CODES = new Set(['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET',
                             'ERR_STREAM_PREMATURE_CLOSE']);
const TIMEOUT_CODES = new Set(['ETIMEDOUT', 'ESOCKETTIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT',
                               'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT']);
const TLS_CODES = new Set(['DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN',
                           'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'CERT_HAS_EXPIRED',
                           'ERR_TLS_CERT_ALTNAME_INVALID', 'EPROTO']);

/** The transport error kind `err`'s own code or name says, and whether it decides. A refusal, a
 * failed lookup, a reset, a TLS failure and a timeout decide (a timeout: the request may have
 * been sent, and a refusal found behind it must not make it look unsent); a system error of
 * another kind is "other" and does not: what it carries may say more. */
function ownKind(err) {
  const code = typeof err.code === 'string' ? err.code : '';
  if (DNS_CODES.has(code)) return ['dns', true];
  if (code === 'ECONNREFUSED') return ['connect_refused', true];
  // axios says ECONNABORTED for its own timeout ("timeout of 800ms exceeded").
  if (TIMEOUT_CODES.has(code) || err.name === 'TimeoutError' ||
      (code === 'ECONNABORTED' && /timeout/i.test(String(err.message)))) return ['timeout', true];
  if (RESET_CODES.has(code) || code === 'ECONNABORTED') return ['connection_reset', true];
  if (TLS_CODES.has(code) || /^(ERR_TLS_|ERR_SSL_|ERR_OSSL_|CERT_|UNABLE_TO_)/.test(code)) {
    return ['tls', true];
  }
  if (typeof err.syscall === 'string' || /^E[A-Z]+$/.test(code) || /^UND_ERR_/.test(code)) {
    return ['other', false];
  }
  return [null, false];
}

// How many errors one classification looks at: a cause chain can be long, or loop.
const CHAIN_LIMIT = 64;

/** Maps an error thrown by an attempt to a transport error kind, an AttemptResult, or null.
 *
 * An error that carries an HTTP response (axios's AxiosError for a status its validateStatus
 * refuses) is that response, with the error as its value. Node's system error codes give the
 * kind: ENOTFOUND and EAI_AGAIN "dns", ECONNREFUSED "connect_refused", ECONNRESET and EPIPE
 * "connection_reset", the TLS codes "tls", ETIMEDOUT, undici's timeouts, axios's timeout and
 * an AbortSignal.timeout's TimeoutError "timeout", any other system error "other". The cause
 * chain is followed, nearest first (`cause`, as fetch's "fetch failed" TypeError carries the
 * socket's error, and an AggregateError's `errors`): the first error there of a specific kind
 * decides, so a refusal is "connect_refused" through fetch and axios alike. null (anything
 * else: a bug in the attempt function, an AbortError of the caller's own) ends the call at once:
 * the attempt counts as a failure and the error is thrown again. */
function defaultClassifyError(err) {
  if (err != null && typeof err === 'object' && err.response != null &&
      responseStatus(err.response) !== null) {
    return fromResponse(err, err.response);
  }
  let fallback = null;
  const queue = [err];
  const seen = new Set([err]);
  while (queue.length) {
    const current = queue.shift();
    if (current == null || typeof current !== 'object') continue;
    const [kind, decides] = ownKind(current);
    if (decides) return kind;
    if (fallback === null) fallback = kind;
    const carried = [current.cause];
    if (Array.isArray(current.errors)) carried.push(...current.errors);
    for (const inner of carried) {
      if (inner != null && !seen.has(inner) && seen.size < CHAIN_LIMIT) {
        seen.add(inner);
        queue.push(inner);
      }
    }
  }
  return fallback;
}

/** A classification table of one's own: the library's defaults (classify.h), then overrides.
 * Configure it before the calls that use it. */
class Classifier {
  constructor() {
    const native = require('./native');
    const why = native.load();
    if (why) throw new LibraryNotFoundError(why);
    this._native = native;
    this._handle = native.classifierNew();
  }

  _rule(which, key, attemptClass, breaker, retryUnsafe, what) {
    if (!(attemptClass in CLASSES)) throw new TypeError(`${what}: unknown class ${attemptClass}`);
    if (!(breaker in OUTCOMES)) throw new TypeError(`${what}: unknown breaker outcome ${breaker}`);
    const rc = this._native.classifierSet(this._handle, which, key, CLASSES[attemptClass],
                                          OUTCOMES[breaker], Boolean(retryUnsafe));
    if (rc !== 0) throw new RangeError(`${what}: invalid rule`);
    return this;
  }

  /** Sets the rule for one HTTP status (100..599). */
  setStatus(status, attemptClass, breaker, retryUnsafe = false) {
    if (!Number.isInteger(status)) throw new TypeError(`status ${status}: not an integer`);
    return this._rule(0, status, attemptClass, breaker, retryUnsafe, `status ${status}`);
  }

  /** Sets the rule for a transport error kind ("timeout", ...). */
  setError(error, attemptClass, breaker, retryUnsafe = false) {
    if (!(error in ERROR_KINDS)) throw new TypeError(`unknown error kind ${error}`);
    return this._rule(1, ERROR_KINDS[error], attemptClass, breaker, retryUnsafe, `error ${error}`);
  }

  /** Adds `method` to, or removes it from, the methods safe to repeat. */
  setIdempotent(method, idempotent = true) {
    const rc = this._native.classifierSetIdempotent(this._handle, String(method),
                                                    Boolean(idempotent));
    if (rc !== 0) throw new RangeError(`method ${method}: invalid rule`);
    return this;
  }
}

const DEFAULTS = Object.freeze({
  maxAttempts: 3,
  jitter: 'full',
  baseMs: 100,
  capMs: 10000,
  retryAfterJitterMs: 100,
  retryAfterMaxMs: 30000,
  deadlineMs: null,
  attemptTimeoutMs: null,
  expectedAttemptMs: null,
  method: 'GET',
  idempotencyKey: false,
  classifier: null,
  inspect: defaultInspect,
  classifyError: defaultClassifyError,
  observer: null,
});

function checkMs(policy, key, { nullable = false, min = 0 } = {}) {
  const v = policy[key];
  if (v == null && nullable) return;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min) {
    throw new TypeError(`policy.${key} must be a finite number of milliseconds >= ${min}` +
                        `${nullable ? ' or null' : ''}, got ${v}`);
  }
}

/** Returns the policy `given` (a plain object of the keys of DEFAULTS; null: every default)
 * with its defaults filled in and every value checked. Throws a TypeError naming the key for an
 * unknown key or a bad value. */
function normalizePolicy(given) {
  if (given != null && typeof given !== 'object') {
    throw new TypeError(`policy must be an object, got ${typeof given}`);
  }
  for (const key of Object.keys(given || {})) {
    if (!(key in DEFAULTS)) {
      const known = Object.keys(DEFAULTS).join(', ');
      throw new TypeError(`policy: unknown key ${key} (known: ${known})`);
    }
  }
  const p = { ...DEFAULTS };
  for (const [k, v] of Object.entries(given || {})) if (v !== undefined) p[k] = v;
  if (!Number.isInteger(p.maxAttempts) || p.maxAttempts < 1 || p.maxAttempts > 0xffffffff) {
    throw new TypeError(`policy.maxAttempts must be an integer >= 1, got ${p.maxAttempts}`);
  }
  if (!(p.jitter in JITTERS)) {
    const known = Object.keys(JITTERS).join(', ');
    throw new TypeError(`policy.jitter must be one of ${known}, got ${p.jitter}`);
  }
  checkMs(p, 'baseMs');
  checkMs(p, 'capMs');
  checkMs(p, 'retryAfterJitterMs');
  checkMs(p, 'retryAfterMaxMs');
  checkMs(p, 'deadlineMs', { nullable: true });
  checkMs(p, 'attemptTimeoutMs', { nullable: true, min: 1 });
  checkMs(p, 'expectedAttemptMs', { nullable: true });
  if (typeof p.method !== 'string' || p.method === '') {
    throw new TypeError(`policy.method must be a non-empty string, got ${p.method}`);
  }
  if (p.classifier != null && !(p.classifier instanceof Classifier)) {
    throw new TypeError('policy.classifier must be a retryd.Classifier');
  }
  for (const key of ['inspect', 'classifyError']) {
    if (typeof p[key] !== 'function') throw new TypeError(`policy.${key} must be a function`);
  }
  if (p.observer != null && typeof p.observer !== 'function') {
    throw new TypeError('policy.observer must be a function or null');
  }
  return p;
}

/** The native arguments of retryd_steps_begin for a normalized policy (after the client and
 * the dependency). */
function nativePolicy(p) {
  const ms = (v) => Math.round(v);
  return [
    p.maxAttempts, JITTERS[p.jitter], ms(p.baseMs), ms(p.capMs), ms(p.retryAfterJitterMs),
    ms(p.retryAfterMaxMs), p.deadlineMs == null ? -1 : ms(p.deadlineMs),
    p.attemptTimeoutMs == null ? -1 : Math.max(1, ms(p.attemptTimeoutMs)),
    p.expectedAttemptMs == null ? 0 : ms(p.expectedAttemptMs), p.method, Boolean(p.idempotencyKey),
    p.classifier ? p.classifier._handle : null,
  ];
}

/** The breaker outcome named by `outcome` ("success", "failure", "ignored"). */
function outcomeCode(outcome) {
  const code = OUTCOMES[outcome];
  if (code === undefined) {
    throw new TypeError(`outcome must be "success", "failure" or "ignored", got ${outcome}`);
  }
  return code;
}

module.exports = {
  AttemptResult, Classifier, DEFAULTS, ERROR_KINDS, ERROR_NAMES, CLASSES, CLASS_NAMES,
  OUTCOMES, OUTCOME_NAMES, JITTERS, defaultInspect, defaultClassifyError, header, normalizePolicy,
  nativePolicy, outcomeCode,
};
