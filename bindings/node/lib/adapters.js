'use strict';
// HTTP-client adapters: every request made through them runs in a dependency's retry loop.
//
//   const get = retryd.adapters.fetch(payments, policy);          // fetch's signature
//   const res = await get('http://payments/v1/health');
//
//   const http = axios.create({ adapter: retryd.adapters.axios(axios, payments, policy) });
//
// Each request is one dep.call: every attempt is admitted by the host and reported to it, and
// classified by the policy (by default, retryd/classify.h: a refused connection, a failed
// lookup, a 408, 425 or 429 is retried for any method; a 5xx, a timeout or a reset only for an
// idempotent method or a request with an idempotency key; a 4xx is the caller's fault and ends
// the call without counting against the breaker). The request's method is the policy's
// `method`; a request carrying one of `idempotencyHeaders` (default Idempotency-Key,
// X-Idempotency-Key) has an idempotency key, as does every request when the policy says
// `idempotencyKey: true`. Between attempts the loop waits on a timer, with backoff and jitter
// or as long as the server's Retry-After asks. Each attempt's time (the policy's
// attemptTimeoutMs, clamped to what is left of its deadlineMs) bounds it (an AbortSignal, and
// axios's `timeout`), and is sent downstream in `deadlineHeader` (default grpc-timeout; null
// sends none) unless the request already carries one. A request whose body cannot be sent
// twice (a stream) gets one attempt.
//
// When the loop stops, the caller gets what the last attempt got, as the client would have
// given it: its response (a 4xx, or the last 503 when attempts, the deadline or the host's
// retry budget ran out), or the error it threw (a refused connection, a timeout; for axios, also
// the AxiosError of a status its validateStatus refuses). Either carries the CallResult as
// `retrydResult` (stop, attempts, last status and error). A response discarded for a retry has
// its body cancelled. Only when the host refuses the first attempt (breaker open, half-open
// probe busy, bulkhead full) does the request reject with RejectedError: nothing was sent, serve
// a fallback. When no attempt could go out at all (a deadline already spent), CallFailedError.

const { CallFailedError, RejectedError } = require('./errors');

const DEFAULT_IDEMPOTENCY_HEADERS = Object.freeze(['Idempotency-Key', 'X-Idempotency-Key']);
const DEFAULT_DEADLINE_HEADER = 'grpc-timeout';
// fetch upper-cases these methods, and sends any other as it is given.
const NORMALIZED_METHODS = new Set(['DELETE', 'GET', 'HEAD', 'OPTIONS', 'POST', 'PUT']);
const ADAPTER_OPTIONS = ['fetch', 'adapter', 'idempotencyHeaders', 'deadlineHeader'];

function tag(obj, result) {
  if (obj === null || (typeof obj !== 'object' && typeof obj !== 'function')) return;
  try {
    Object.defineProperty(obj, 'retrydResult',
                          { value: result, configurable: true, writable: true });
  } catch {
    // a frozen object: the result is still on the error's cause
  }
}

/** Sends one request through `dep`'s retry loop and resolves to the last response.
 * send(attempt) makes one attempt (resolving to the client's response or rejecting with the
 * client's error); discard(response) releases a response that is being retried. */
async function run(dep, policy, method, hasKey, send, discard, replayable, signal) {
  const p = { ...(policy || {}), method,
              idempotencyKey: Boolean((policy && policy.idempotencyKey) || hasKey) };
  if (!replayable) p.maxAttempts = 1;
  let previous;
  const attempt = async (a) => {
    if (previous !== undefined) {
      const stale = previous;
      previous = undefined;
      try {
        await discard(stale);
      } catch {
        // a response that fails to close is dropped anyway
      }
    }
    const response = await send(a);
    previous = response;
    return response;
  };
  let failure;
  try {
    return await dep.call(attempt, p, { signal });
  } catch (e) {
    if (e instanceof CallFailedError) {
      failure = e;
    } else if (e instanceof RejectedError && e.result !== null && e.result.attempts > 0) {
      failure = e; // a retry refused: the last attempt's outcome stands
    } else {
      throw e;
    }
  }
  const result = failure.result;
  if (result.error !== undefined) {
    tag(result.error, result);
    throw result.error;
  }
  if (result.value === undefined) throw failure; // nothing went out (no time for an attempt)
  tag(result.value, result);
  return result.value;
}

function checkOptions(options, what) {
  if (options === null || typeof options !== 'object') {
    throw new TypeError(`${what}: options must be an object`);
  }
  for (const key of Object.keys(options)) {
    if (!ADAPTER_OPTIONS.includes(key)) {
      throw new TypeError(`${what}: unknown option ${key} (known: ${ADAPTER_OPTIONS.join(', ')})`);
    }
  }
  const idempotencyHeaders = options.idempotencyHeaders === undefined
    ? DEFAULT_IDEMPOTENCY_HEADERS : options.idempotencyHeaders || [];
  const deadlineHeader = options.deadlineHeader === undefined
    ? DEFAULT_DEADLINE_HEADER : options.deadlineHeader;
  return { idempotencyHeaders, deadlineHeader };
}

function checkDependency(dep, what) {
  if (dep === null || typeof dep !== 'object' || typeof dep.call !== 'function') {
    throw new TypeError(`${what}: the first argument must be a retryd Dependency`);
  }
}

function replayableBody(body) {
  return body == null || typeof body === 'string' || body instanceof ArrayBuffer ||
    ArrayBuffer.isView(body) || body instanceof URLSearchParams || body instanceof Blob ||
    body instanceof FormData;
}

/** fetch(dep, policy, {fetch, idempotencyHeaders, deadlineHeader}) returns a function with
 * fetch's signature that sends each request through `dep`'s retry loop, over `fetch` (default:
 * the global fetch, Node's undici). */
function fetchAdapter(dep, policy = null, options = {}) {
  checkDependency(dep, 'retryd.adapters.fetch');
  const { idempotencyHeaders, deadlineHeader } = checkOptions(options, 'retryd.adapters.fetch');
  const send = options.fetch || globalThis.fetch;
  if (typeof send !== 'function') throw new TypeError('retryd.adapters.fetch: no fetch function');

  return async function retrydFetch(input, init = {}) {
    const request = input instanceof Request ? input : null;
    let method = String(init.method || (request ? request.method : 'GET'));
    if (NORMALIZED_METHODS.has(method.toUpperCase())) method = method.toUpperCase();
    const headers = new Headers(init.headers || (request ? request.headers : undefined));
    const hasKey = idempotencyHeaders.some((h) => headers.has(h));
    // A Request is cloned for each attempt (the original is never read); a body of init's
    // must be one fetch can send twice.
    const replayable = init.body !== undefined ? replayableBody(init.body) : true;
    const signal = init.signal || (request ? request.signal : null) || null;

    const one = (attempt) => {
      const h = new Headers(headers);
      if (deadlineHeader && attempt.timeoutMs !== null && !h.has(deadlineHeader)) {
        const value = attempt.deadlineHeader;
        if (value !== null) h.set(deadlineHeader, value);
      }
      return send(request ? request.clone() : input,
                  { ...init, method, headers: h, signal: attempt.signal });
    };
    const discard = async (response) => {
      if (response && response.body && !response.bodyUsed) await response.body.cancel();
    };
    return run(dep, policy, method, hasKey, one, discard, replayable, signal);
  };
}

const identity = (data) => data;
const OURS = Symbol('retryd.axiosAdapter');

function axiosHeaderNames(headers) {
  if (headers == null) return [];
  const plain = typeof headers.toJSON === 'function' ? headers.toJSON() : headers;
  return Object.keys(plain).map((k) => k.toLowerCase());
}

/** axios(axios, dep, policy, {adapter, idempotencyHeaders, deadlineHeader}) returns an axios
 * adapter (config.adapter) that sends each request through `dep`'s retry loop: each attempt
 * goes out through `adapter` (default: axios's own, ['xhr', 'http']) by an instance of
 * `axios` (the module, passed in: this package does not require it) with no interceptors and
 * no transforms, so the request's interceptors and transforms run once, around the call. */
function axiosAdapter(axios, dep, policy = null, options = {}) {
  if (axios === null || typeof axios !== 'function' || typeof axios.create !== 'function') {
    throw new TypeError('retryd.adapters.axios: the first argument must be the axios module');
  }
  checkDependency(dep, 'retryd.adapters.axios');
  const { idempotencyHeaders, deadlineHeader } = checkOptions(options, 'retryd.adapters.axios');
  let inner = options.adapter;
  if (inner === undefined) {
    const fallback = axios.defaults && axios.defaults.adapter;
    const ours = typeof fallback === 'function' && fallback[OURS];
    inner = fallback && !ours ? fallback : ['xhr', 'http'];
  }
  const bare = axios.create();
  const wanted = idempotencyHeaders.map((h) => h.toLowerCase());

  const adapter = function retrydAxiosAdapter(config) {
    const method = String(config.method || 'get').toUpperCase();
    const names = axiosHeaderNames(config.headers);
    const hasKey = wanted.some((h) => names.includes(h));
    // After axios's transforms the body is a string, a Buffer, form data or a stream.
    const data = config.data;
    const replayable = data == null || typeof data === 'string' || Buffer.isBuffer(data) ||
      data instanceof ArrayBuffer || ArrayBuffer.isView(data) || data instanceof URLSearchParams;
    const signal = config.signal instanceof AbortSignal ? config.signal : null;

    const one = (attempt) => {
      const plain = config.headers && typeof config.headers.toJSON === 'function'
        ? config.headers.toJSON() : { ...(config.headers || {}) };
      if (deadlineHeader && attempt.timeoutMs !== null &&
          !Object.keys(plain).some((k) => k.toLowerCase() === deadlineHeader.toLowerCase())) {
        const value = attempt.deadlineHeader;
        if (value !== null) plain[deadlineHeader] = value;
      }
      let timeout = config.timeout;
      if (attempt.timeoutMs !== null) {
        const t = Math.max(1, Math.ceil(attempt.timeoutMs));
        timeout = timeout > 0 ? Math.min(timeout, t) : t;
      }
      return bare.request({
        ...config, headers: plain, timeout, signal: attempt.signal, adapter: inner,
        transformRequest: [identity], transformResponse: [identity],
      });
    };
    const discard = () => {}; // axios has read each response whole
    return run(dep, policy, method, hasKey, one, discard, replayable, signal);
  };
  adapter[OURS] = true;
  return adapter;
}

module.exports = {
  fetch: fetchAdapter, axios: axiosAdapter, run, DEFAULT_IDEMPOTENCY_HEADERS,
  DEFAULT_DEADLINE_HEADER,
};
