'use strict';
// dep.call: the retry loop of the C library (retryd_steps_*) driven from JavaScript, on a real
// segment, with its waits on timers.

const test = require('node:test');
const assert = require('assert');
const { retryd, sleep, makeSegment, depStatus } = require('./harness');

const OPEN_LONG = {
  min_calls: 2,
  failure_rate_threshold: 50,
  open_for: '60s',
  open_for_max: '60s',
};
const PLENTY = { min_calls: 100000, retry_burst: 100000, min_retries_per_sec: 100000 };

let seg;
let client;
let where;
test.before(async () => {
  seg = await makeSegment({
    plain: PLENTY,
    retried: PLENTY,
    exhausted: PLENTY,
    terminal: PLENTY,
    opened: OPEN_LONG,
    thrifty: { min_calls: 100000, retry_burst: 1, retry_ratio: 0, min_retries_per_sec: 0 },
    bug: PLENTY,
    refused: PLENTY,
    waits: PLENTY,
    deadline: PLENTY,
    cancel: PLENTY,
    inflight: PLENTY,
    many: PLENTY,
    slow: PLENTY,
    post: PLENTY,
    custom: PLENTY,
  });
  client = new retryd.Client({ segment: seg.name, fallbackToLocal: false });
  where = { segment: seg.name };
});
test.after(async () => {
  client.close();
  await seg.close();
});

const response = (status, extra = {}) => ({ status, headers: {}, ...extra });
const fast = { baseMs: 1, capMs: 2, deadlineMs: 30000 };

test('a first attempt that succeeds: its value, and the attempt it was told', async () => {
  const seen = [];
  const value = await client.dependency('plain').call(async (attempt) => {
    seen.push(attempt);
    return 'hello';
  });
  assert.strictEqual(value, 'hello');
  assert.strictEqual(seen.length, 1);
  assert.strictEqual(seen[0].number, 0);
  assert.strictEqual(seen[0].timeoutMs, null);
  assert.strictEqual(seen[0].deadlineHeader, null);
  assert.ok(seen[0].signal instanceof AbortSignal);
  const timed = await client.dependency('plain').call((a) => a, { attemptTimeoutMs: 800 });
  assert.ok(timed.timeoutMs > 0 && timed.timeoutMs <= 800, `timeoutMs ${timed.timeoutMs}`);
  assert.match(timed.deadlineHeader, /^\d{1,8}[HMSmun]$/);
});

test('a 503 is retried, and each admission is shown to the observer', async () => {
  const infos = [];
  let n = 0;
  const value = await client
    .dependency('retried')
    .call(async () => (n++ === 0 ? response(503) : response(200, { body: 'ok' })), {
      ...fast,
      observer: (i) => infos.push(i),
    });
  assert.strictEqual(value.body, 'ok');
  assert.deepStrictEqual(
    infos.map((i) => [i.attempt, i.decision, i.status, i.attemptClass, i.next]),
    [
      [0, 'admitted', 503, 'retryable', 'retry'],
      [1, 'admitted', 200, 'success', 'success'],
    ],
  );
  const dep = await depStatus(where, 'retried');
  assert.strictEqual(dep.counters.first_attempts, 1);
  assert.strictEqual(dep.counters.retries_granted, 1);
  assert.strictEqual(dep.counters.failures, 1);
  assert.strictEqual(dep.counters.successes, 1);
});

test('giving up throws CallFailedError with the last value; a 4xx ends it and is ignored', async () => {
  let n = 0;
  const e = await client
    .dependency('exhausted')
    .call(async () => response(503, { n: n++ }), fast)
    .catch((err) => err);
  assert.ok(e instanceof retryd.CallFailedError, String(e));
  assert.strictEqual(e.result.stop, 'attempts_exhausted');
  assert.strictEqual(e.result.attempts, 3);
  assert.strictEqual(e.result.lastStatus, 503);
  assert.strictEqual(e.result.value.n, 2);

  const t = await client
    .dependency('terminal')
    .call(async () => response(404), fast)
    .catch((err) => err);
  assert.ok(t instanceof retryd.CallFailedError);
  assert.strictEqual(t.result.stop, 'terminal');
  assert.strictEqual(t.result.attempts, 1);
  const dep = await depStatus(where, 'terminal');
  assert.strictEqual(dep.counters.ignored, 1);
  assert.strictEqual(dep.counters.failures, 0);
});

test('an open breaker rejects the call and nothing is sent', async () => {
  const opened = client.dependency('opened');
  opened.admit().complete('failure');
  opened.admit().complete('failure');
  let called = false;
  const e = await opened
    .call(() => {
      called = true;
    }, fast)
    .catch((err) => err);
  assert.ok(e instanceof retryd.RejectedError);
  assert.strictEqual(e.reason, 'open');
  assert.strictEqual(e.result.attempts, 0);
  assert.strictEqual(e.result.stop, 'rejected');
  assert.strictEqual(called, false);
});

test("a retry the host's budget refuses rejects with budget_empty and the last value", async () => {
  const thrifty = client.dependency('thrifty');
  thrifty.admit(1).complete(); // the one token
  let n = 0;
  const e = await thrifty.call(async () => response(503, { n: n++ }), fast).catch((err) => err);
  assert.ok(e instanceof retryd.RejectedError);
  assert.strictEqual(e.reason, 'budget_empty');
  assert.strictEqual(e.result.attempts, 1);
  assert.strictEqual(e.result.value.n, 0);
});

test('an error the policy does not map is thrown as it is, after one attempt counted as a failure', async () => {
  let n = 0;
  const bug = new TypeError('undefined is not a function');
  await assert.rejects(
    client.dependency('bug').call(async () => {
      n++;
      throw bug;
    }, fast),
    (e) => e === bug,
  );
  assert.strictEqual(n, 1);
  assert.strictEqual((await depStatus(where, 'bug')).counters.failures, 1);
});

test('a refused connection is retried, even for a POST', async () => {
  let n = 0;
  const infos = [];
  const value = await client.dependency('refused').call(
    async () => {
      if (n++ === 0) {
        throw new TypeError('fetch failed', {
          cause: Object.assign(new Error('connect ECONNREFUSED'), {
            code: 'ECONNREFUSED',
            syscall: 'connect',
          }),
        });
      }
      return response(201);
    },
    { ...fast, method: 'POST', observer: (i) => infos.push(i) },
  );
  assert.strictEqual(value.status, 201);
  assert.deepStrictEqual(
    infos.map((i) => [i.error, i.next]),
    [
      ['connect_refused', 'retry'],
      ['none', 'success'],
    ],
  );
});

test('the wait is a timer: the event loop runs while the call waits out a Retry-After', async () => {
  let ticks = 0;
  const ticker = setInterval(() => {
    ticks++;
  }, 10);
  const infos = [];
  const times = [];
  let n = 0;
  try {
    const value = await client.dependency('waits').call(
      async () => {
        times.push(performance.now());
        return n++ === 0 ? response(503, { headers: { 'retry-after': '1' } }) : response(200);
      },
      { ...fast, retryAfterJitterMs: 10, observer: (i) => infos.push(i) },
    );
    assert.strictEqual(value.status, 200);
  } finally {
    clearInterval(ticker);
  }
  assert.strictEqual(infos[0].retryAfterMs, 1000);
  assert.ok(infos[0].waitMs >= 1000, `waited ${infos[0].waitMs} ms`);
  assert.ok(times[1] - times[0] >= 999, `the retry went out ${times[1] - times[0]} ms after`);
  // 1 s of waiting: a blocked loop would have ticked not at all.
  assert.ok(ticks >= 20, `the interval ticked ${ticks} times during the wait`);
});

test('the deadline ends the call instead of a wait it has no time for', async () => {
  const start = performance.now();
  const e = await client
    .dependency('deadline')
    .call(async () => response(503), { baseMs: 5000, capMs: 5000, jitter: 'none', deadlineMs: 300 })
    .catch((err) => err);
  assert.ok(e instanceof retryd.CallFailedError);
  assert.strictEqual(e.result.stop, 'deadline');
  assert.ok(performance.now() - start < 3000);
});

test('an AbortSignal cancels the call during its wait and during an attempt', async () => {
  const cancel = client.dependency('cancel');
  const ac = new AbortController();
  let n = 0;
  const pending = cancel.call(
    async () => {
      n++;
      return response(503);
    },
    { baseMs: 10000, capMs: 10000, jitter: 'none' },
    { signal: ac.signal },
  );
  await sleep(50);
  ac.abort();
  await assert.rejects(pending, { name: 'AbortError' });
  assert.strictEqual(n, 1);

  const inflight = client.dependency('inflight');
  const ac2 = new AbortController();
  const during = inflight.call(
    (attempt) =>
      new Promise((resolve, reject) => {
        attempt.signal.addEventListener('abort', () => reject(attempt.signal.reason));
      }),
    fast,
    { signal: ac2.signal },
  );
  await sleep(20);
  ac2.abort(new Error('the user went away'));
  await assert.rejects(during, /the user went away/);
  const dep = await depStatus(where, 'inflight');
  assert.strictEqual(dep.counters.ignored, 1, 'the attempt in flight is reported as ignored');
  assert.strictEqual(dep.counters.failures, 0);
});

test('an attempt whose own time runs out is a timeout, retried for a GET, not for a POST', async () => {
  const hang = (attempt) =>
    new Promise((resolve, reject) => {
      attempt.signal.addEventListener('abort', () => reject(attempt.signal.reason));
    });
  const infos = [];
  const e = await client
    .dependency('slow')
    .call(hang, { ...fast, attemptTimeoutMs: 30, maxAttempts: 2, observer: (i) => infos.push(i) })
    .catch((err) => err);
  assert.ok(e instanceof retryd.CallFailedError, String(e));
  assert.deepStrictEqual(
    infos.map((i) => i.error),
    ['timeout', 'timeout'],
  );
  assert.strictEqual(e.cause.name, 'TimeoutError');

  const post = await client
    .dependency('post')
    .call(hang, { ...fast, attemptTimeoutMs: 30, method: 'POST' })
    .catch((err) => err);
  assert.strictEqual(post.result.stop, 'terminal', 'a POST that may have been sent fails closed');
  assert.strictEqual(post.result.attempts, 1);
  const keyed = await client
    .dependency('post')
    .call(hang, {
      ...fast,
      attemptTimeoutMs: 30,
      method: 'POST',
      idempotencyKey: true,
      maxAttempts: 2,
    })
    .catch((err) => err);
  assert.strictEqual(keyed.result.attempts, 2);
});

test('200 calls at once on one thread each get their own attempts and value', async () => {
  const calls = [];
  for (let id = 0; id < 200; id++) {
    let n = 0;
    calls.push(
      client.dependency('many').call(async (attempt) => {
        assert.strictEqual(attempt.number, n);
        await sleep(Math.floor(Math.random() * 20));
        return n++ === 0 ? response(503) : response(200, { id });
      }, fast),
    );
  }
  const values = await Promise.all(calls);
  assert.deepStrictEqual(
    values.map((v) => v.id),
    [...Array(200).keys()],
  );
  const dep = await depStatus(where, 'many');
  assert.strictEqual(dep.counters.first_attempts, 200);
  assert.strictEqual(dep.counters.retries_granted, 200);
  assert.strictEqual(dep.counters.successes, 200);
});

test("a classifier of one's own, and a policy with a bad key or value is refused by name", async () => {
  const classifier = new retryd.Classifier().setStatus(404, 'retryable', 'failure');
  let n = 0;
  const value = await client
    .dependency('custom')
    .call(async () => (n++ === 0 ? response(404) : response(200)), { ...fast, classifier });
  assert.strictEqual(value.status, 200);
  assert.throws(() => classifier.setStatus(404, 'maybe', 'failure'), /unknown class maybe/);
  await assert.rejects(
    client.dependency('custom').call(() => 1, { retries: 3 }),
    /unknown key retries/,
  );
  await assert.rejects(
    client.dependency('custom').call(() => 1, { jitter: 'lots' }),
    /policy.jitter must be one of/,
  );
  await assert.rejects(
    client.dependency('custom').call(() => 1, { deadlineMs: -1 }),
    /policy.deadlineMs/,
  );
  await assert.rejects(client.dependency('custom').call('not a function'), /fn must be a function/);
});

test('close() during a call keeps the client open until the call ends', async () => {
  const seg2 = await makeSegment({ orders: PLENTY });
  try {
    const c = new retryd.Client({ segment: seg2.name, fallbackToLocal: false });
    const orders = c.dependency('orders');
    let release;
    const gate = new Promise((resolve) => {
      release = resolve;
    });
    const pending = orders.call(async () => {
      await gate;
      return response(200, { body: 'late' });
    }, fast);
    await sleep(10);
    c.close();
    assert.throws(() => orders.admit(), /client is closed/);
    release();
    assert.strictEqual((await pending).body, 'late');
    const dep = await depStatus({ segment: seg2.name }, 'orders');
    assert.strictEqual(dep.counters.successes, 1, 'the attempt in flight was reported');
  } finally {
    await seg2.close();
  }
});

test('errors map to transport error kinds through their codes and causes', () => {
  const sys = (code, message = code) =>
    Object.assign(new Error(message), { code, syscall: 'connect' });
  const kinds = [
    [sys('ENOTFOUND'), 'dns'],
    [sys('EAI_AGAIN'), 'dns'],
    [sys('ECONNREFUSED'), 'connect_refused'],
    [sys('ECONNRESET'), 'connection_reset'],
    [sys('EPIPE'), 'connection_reset'],
    [sys('UND_ERR_SOCKET', 'other side closed'), 'connection_reset'],
    [sys('ETIMEDOUT'), 'timeout'],
    [sys('UND_ERR_HEADERS_TIMEOUT'), 'timeout'],
    [sys('ECONNABORTED', 'timeout of 800ms exceeded'), 'timeout'], // axios's own timeout
    [new DOMException('The operation was aborted due to timeout', 'TimeoutError'), 'timeout'],
    [sys('ERR_TLS_CERT_ALTNAME_INVALID'), 'tls'],
    [sys('DEPTH_ZERO_SELF_SIGNED_CERT'), 'tls'],
    [sys('EHOSTUNREACH'), 'other'],
    // fetch: TypeError('fetch failed') carries the socket's error, or an AggregateError of one
    // per address tried.
    [new TypeError('fetch failed', { cause: sys('ECONNREFUSED') }), 'connect_refused'],
    [
      new TypeError('fetch failed', {
        cause: new AggregateError([sys('EHOSTUNREACH'), sys('ECONNREFUSED')]),
      }),
      'connect_refused',
    ],
    // A timeout says the request may have gone out: a refusal behind it does not make it safe.
    [Object.assign(sys('ETIMEDOUT'), { cause: sys('ECONNREFUSED') }), 'timeout'],
    [new TypeError('x is not a function'), null],
    [new DOMException('This operation was aborted', 'AbortError'), null],
    ['a string thrown', null],
  ];
  for (const [error, kind] of kinds) {
    assert.strictEqual(
      retryd.defaultClassifyError(error),
      kind,
      `${error && (error.code || error.name || error)}`,
    );
  }
  const withResponse = Object.assign(new Error('Request failed with status code 503'), {
    response: {
      status: 503,
      headers: { 'retry-after': '2', date: 'Tue, 01 Dec 2026 10:00:00 GMT' },
    },
  });
  const res = retryd.defaultClassifyError(withResponse);
  assert.ok(res instanceof retryd.AttemptResult);
  assert.deepStrictEqual(
    [res.status, res.retryAfter, res.date, res.value],
    [503, '2', 'Tue, 01 Dec 2026 10:00:00 GMT', withResponse],
  );
});
