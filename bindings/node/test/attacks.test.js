'use strict';
// The binding's promises attacked in one process, on real segments (and a real daemon's socket)
// read back with retryctl, and a real HTTP server: an attempt that ignores its signal, a call
// dropped unfinished, waits past what a timer holds, NULs in names and paths, a permit
// completed after close(), axios's per-attempt timeout, 3000 calls aborted at random moments.
// A failing test here is a broken promise: its title says which.

const test = require('node:test');
const assert = require('assert');
const fs = require('fs');
const http = require('http');
const v8 = require('v8');
const vm = require('vm');
const axios = require('axios'); // Debian's node-axios, through NODE_PATH=/usr/share/nodejs
const {
  retryd, poll, makeSegment, depStatus, liveWorkers, startDaemon, tmpdir,
} = require('./harness');

const native = require('../lib/native');

const TIMER_MAX_MS = 2 ** 31 - 1; // the longest delay setTimeout holds
const DAY_MS = 86400e3;

async function withSegment(deps, fn) {
  const seg = await makeSegment(deps);
  const client = new retryd.Client({ segment: seg.name, fallbackToLocal: false });
  try {
    await fn(client, { segment: seg.name }, seg);
  } finally {
    client.close();
    await seg.close();
  }
}

/** Settles to ['resolved', v], ['rejected', e] or ['pending'] once `ms` have passed. */
function within(promise, ms) {
  return Promise.race([
    promise.then((v) => ['resolved', v], (e) => ['rejected', e]),
    new Promise((resolve) => setTimeout(() => resolve(['pending']), ms)),
  ]);
}

/** A promise and the functions that settle it. */
function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

const unhandled = [];
process.on('unhandledRejection', (e) => unhandled.push(e));

test('an abort ends the call at once when the attempt ignores its signal; what it does later is ignored', async () => {
  // An attempt that does not pass attempt.signal on (a client without AbortSignal support, a
  // callback API) must not keep the call, and its bulkhead lease, after the caller gave up.
  await withSegment({ pool: { bulkhead_limit: 1, min_calls: 100000 } }, async (client, where) => {
    const pool = client.dependency('pool');
    for (const late of ['resolve', 'reject']) {
      const controller = new AbortController();
      const attempt = deferred();
      const call = pool.call(() => attempt.promise, { maxAttempts: 1 },
                             { signal: controller.signal });
      assert.strictEqual((await depStatus(where, 'pool')).bulkhead.in_use, 1);
      assert.throws(() => pool.admit(), { reason: 'bulkhead_full' });
      controller.abort(new Error('the caller gave up'));
      const [how, e] = await within(call, 2000);
      assert.strictEqual(how, 'rejected', 'the call still pending 2 s after its abort');
      assert.strictEqual(e.message, 'the caller gave up');
      pool.admit().complete(); // the lease is back
      // The attempt settles after all: nothing more is reported, and nothing is unhandled.
      if (late === 'resolve') attempt.resolve('late'); else attempt.reject(new Error('late'));
      await new Promise(setImmediate);
    }
    const c = (await depStatus(where, 'pool')).counters;
    assert.deepStrictEqual([c.ignored, c.successes, c.failures], [2, 2, 0]);
    assert.deepStrictEqual(unhandled, []);
  });
});

test("an abort gives back the probe of an attempt that ignores its signal", async () => {
  await withSegment(
    {
      flaky: {
        min_calls: 2, failure_rate_threshold: 50, open_for: '200ms', open_for_max: '200ms',
        open_jitter: '0s', half_open_probes: 1, close_after: 1,
      },
    },
    async (client, where) => {
      const flaky = client.dependency('flaky');
      flaky.admit().complete('failure');
      flaky.admit().complete('failure');
      // Once the open period ends, the next call's attempt is the probe.
      const probe = await poll(async () => {
        const controller = new AbortController();
        let attempt = null;
        const call = flaky.call((a) => {
          attempt = a;
          return new Promise(() => {});
        }, { maxAttempts: 1 }, { signal: controller.signal });
        if (attempt === null) {
          await call.catch((e) => assert.strictEqual(e.reason, 'open'));
          return null;
        }
        return { controller, call, attempt };
      }, 'the half-open probe');
      assert.strictEqual(probe.attempt.probe, true);
      assert.throws(() => flaky.admit(), { reason: 'half_open_busy' });
      probe.controller.abort();
      const [how, e] = await within(probe.call, 2000);
      assert.strictEqual(how, 'rejected');
      assert.strictEqual(e.name, 'AbortError');
      const next = flaky.admit();
      assert.strictEqual(next.probe, true, 'the probe was given back');
      next.complete('success');
      assert.strictEqual(flaky.state, 'closed');
      assert.strictEqual((await depStatus(where, 'flaky')).counters.ignored, 1);
    },
  );
});

test('a call dropped unfinished (collected) reports its attempt as ignored and gives back its lease', async () => {
  // No signal, an attempt that never settles, and nobody holding the call: once collected, the
  // call ends as a call its caller gave up on (as an abort ends it), not as a failure.
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc');
  await withSegment({ pool: { bulkhead_limit: 1, min_calls: 100000 } }, async (client, where) => {
    const pool = client.dependency('pool');
    pool.call(() => new Promise(() => {}), { maxAttempts: 1 });
    assert.strictEqual((await depStatus(where, 'pool')).bulkhead.in_use, 1);
    const dep = await poll(async () => {
      gc();
      await new Promise(setImmediate); // the addon's finalizers run after the collection
      const d = await depStatus(where, 'pool');
      return d.bulkhead.in_use === 0 ? d : null;
    }, 'the dropped call to be collected');
    assert.deepStrictEqual([dep.counters.ignored, dep.counters.failures], [1, 0]);
  });
});

test('a wait longer than a timer can hold (2^31 - 1 ms) is not cut to 1 ms', async () => {
  // The policy allows retryAfterMaxMs past 24.8 days, and the library then chooses the wait the
  // server asked for; Node's setTimeout fires anything longer after 1 ms. An abort still ends
  // the wait at once.
  await withSegment({ orders: { min_calls: 100000, retry_burst: 10 } }, async (client, where) => {
    const orders = client.dependency('orders');
    const controller = new AbortController();
    const waits = [];
    let attempts = 0;
    const call = orders.call(
      async () => {
        attempts++;
        return { status: 503, headers: { 'retry-after': String(30 * 86400) } }; // 30 days
      },
      { maxAttempts: 2, retryAfterMaxMs: 40 * DAY_MS, retryAfterJitterMs: 0,
        observer: (r) => waits.push(r.waitMs) },
      { signal: controller.signal },
    );
    const [how] = await within(call, 500);
    assert.deepStrictEqual(waits.slice(0, 1), [30 * DAY_MS], 'the wait the library chose');
    assert.strictEqual(attempts, 1, `${attempts} attempts within 500 ms of a 30-day Retry-After`);
    assert.strictEqual(how, 'pending');
    controller.abort();
    const [after, e] = await within(call, 2000);
    assert.strictEqual(after, 'rejected', 'the call still pending 2 s after its abort');
    assert.strictEqual(e.name, 'AbortError');

    // An attempt's own time past a timer's range does not run out at once either.
    const timedOut = await orders.call(async (a) => {
      const signal = a.signal;
      await new Promise((resolve) => setTimeout(resolve, 100));
      return signal.aborted;
    }, { attemptTimeoutMs: 30 * DAY_MS });
    assert.strictEqual(timedOut, false, "a 30-day attempt's signal fired within 100 ms");
    const c = (await depStatus(where, 'orders')).counters;
    assert.deepStrictEqual([c.failures, c.successes, c.ignored], [1, 1, 0]);
  });
});

test('a 30-day wait is a chain of timers, and the retry goes out when all of it has passed', async (t) => {
  await withSegment({ orders: { min_calls: 100000, retry_burst: 10 } }, async (client) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const orders = client.dependency('orders');
    let attempts = 0;
    const call = orders.call(
      async () => {
        attempts++;
        return attempts === 1 ? { status: 503, headers: { 'retry-after': String(30 * 86400) } }
          : 'done';
      },
      { maxAttempts: 2, retryAfterMaxMs: 40 * DAY_MS, retryAfterJitterMs: 0 },
    );
    const settle = () => new Promise(setImmediate); // setImmediate is not mocked
    await settle();
    assert.strictEqual(attempts, 1);
    t.mock.timers.tick(TIMER_MAX_MS); // the first timer of the chain
    await settle();
    assert.strictEqual(attempts, 1, 'the retry went out after the first timer of the chain');
    t.mock.timers.tick(30 * DAY_MS - TIMER_MAX_MS - 1);
    await settle();
    assert.strictEqual(attempts, 1, 'the retry went out 1 ms early');
    t.mock.timers.tick(1);
    assert.strictEqual(await call, 'done');
    assert.strictEqual(attempts, 2);
  });
});

test('a NUL in a dependency name, a segment or socket path, or a method is refused, not cut short', async () => {
  // The C library reads a name up to its NUL: "orders\0evil" was resolved as "orders" (and
  // cached under the longer name), and a segment "NAME\0junk" opened NAME.
  await withSegment({ orders: {} }, async (client, where) => {
    assert.throws(
      () => client.dependency('orders\0evil'),
      (e) => e instanceof retryd.ClientError && e.code === retryd.constants.EINVAL &&
        /^dependency name "orders\\u0000evil" contains a NUL character/.test(e.message),
    );
    assert.strictEqual(client.dependency('orders').name, 'orders');
    for (const key of ['segment', 'socket']) {
      assert.throws(
        () => new retryd.Client({ [key]: `${where.segment}\0junk`, fallbackToLocal: false }),
        { name: 'TypeError', message: new RegExp(`^Client: ${key} ".*" contains a NUL`) },
      );
    }
    await assert.rejects(client.dependency('orders').call(() => 1, { method: 'GET\0X' }),
                         { name: 'TypeError', message: /^policy\.method .* contains a NUL/ });
    assert.throws(() => new retryd.Classifier().setIdempotent('PUT\0X'),
                  { name: 'TypeError', message: /contains a NUL/ });
    // The addon itself refuses them, naming the argument, whoever calls it.
    assert.throws(() => native.open('x\0y', null, false),
                  { name: 'TypeError', message: /segment contains a NUL character/ });
    assert.throws(() => native.resolve(client._handle, 'orders\0evil'),
                  { name: 'TypeError', message: /dependency name contains a NUL character/ });
  });
});

test('a permit admitted before close() still completes and gives its lease back', async () => {
  // close() keeps the client open for an admitted Permit as for a call in progress: on a
  // segment by name its lease would otherwise stay taken until bulkhead_timeout (1 minute by
  // default; 5 s here), refusing every other worker meanwhile.
  await withSegment({ pool: { bulkhead_limit: 1, bulkhead_timeout: '5s', min_calls: 100000 } },
    async (_client, where) => {
      const first = new retryd.Client({ segment: where.segment, fallbackToLocal: false });
      const permit = first.dependency('pool').admit();
      first.close();
      assert.throws(() => first.dependency('pool').admit(), /client is closed/);
      permit.complete('success');
      const other = new retryd.Client({ segment: where.segment, fallbackToLocal: false });
      try {
        other.dependency('pool').admit().complete();
        const dep = await depStatus(where, 'pool');
        assert.strictEqual(dep.bulkhead.in_use, 0);
        assert.strictEqual(dep.counters.successes, 2);
      } finally {
        other.close();
      }
    });
});

test("through the daemon's socket, a closed client with a permit out stays registered until it completes", async () => {
  const dir = tmpdir('retryd-node-attack-');
  const daemon = await startDaemon(dir, { pool: { bulkhead_limit: 1, min_calls: 100000 } });
  try {
    const client = new retryd.Client({ socket: daemon.socket, fallbackToLocal: false });
    const permit = client.dependency('pool').admit();
    client.close();
    assert.ok((await liveWorkers(daemon))[process.pid], 'registered while the permit is out');
    permit.complete('success');
    await poll(async () => !(await liveWorkers(daemon))[process.pid],
               'the process to leave the registry once its permit completed');
    const dep = await depStatus(daemon, 'pool');
    assert.strictEqual(dep.bulkhead.in_use, 0);
    assert.strictEqual(dep.counters.successes, 1);
  } finally {
    await daemon.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("axios's per-attempt timeout is axios's timeout error, not a cancellation", async () => {
  // Without the adapter, axios's `timeout` rejects with ECONNABORTED ("timeout of 50ms
  // exceeded"; ETIMEDOUT with transitional.clarifyTimeoutError), and axios.isCancel() is false.
  // Through the adapter the attempt's AbortSignal may end it first: that must not look like
  // the caller's own cancellation (CanceledError, ERR_CANCELED).
  const server = http.createServer((req, res) => {
    req.resume();
    setTimeout(() => res.end('late'), 500);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}/slow`;
  try {
    await withSegment({ slow: { min_calls: 100000, retry_burst: 10 } }, async (client) => {
      const adapter = retryd.adapters.axios(axios, client.dependency('slow'),
                                            { maxAttempts: 2, attemptTimeoutMs: 50, baseMs: 1,
                                              capMs: 1 });
      for (const [config, code] of [[{}, 'ECONNABORTED'],
        [{ transitional: { clarifyTimeoutError: true } }, 'ETIMEDOUT']]) {
        const e = await axios.create({ adapter, ...config }).get(url)
          .then(() => null, (err) => err);
        assert.ok(e, 'the request timed out');
        assert.strictEqual(axios.isCancel(e), false, `${e.code}: ${e.message}`);
        assert.ok(axios.isAxiosError(e));
        assert.strictEqual(e.code, code);
        assert.strictEqual(e.message, 'timeout of 50ms exceeded');
        assert.strictEqual(e.retrydResult.lastError, 'timeout');
        assert.strictEqual(e.retrydResult.attempts, 2);
      }
    });
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test('3000 calls aborted at random moments leave no lease, each attempt reported once', async () => {
  await withSegment(
    { pool: { bulkhead_limit: 64, min_calls: 1000000, retry_burst: 100000, retry_ratio: 1 } },
    async (client, where) => {
      const pool = client.dependency('pool');
      const outcomes = {};
      const run = (i) => {
        const controller = new AbortController();
        setTimeout(() => controller.abort(), Math.random() * 40);
        // Every other call's attempts ignore their signal.
        const listens = i % 4 < 2;
        const fn = (a) => new Promise((resolve, reject) => {
          const t = setTimeout(() => resolve(i % 2 ? 'ok' : { status: 503 }), Math.random() * 20);
          if (!listens) return;
          a.signal.addEventListener('abort', () => {
            clearTimeout(t);
            reject(a.signal.reason);
          }, { once: true });
        });
        return pool.call(fn, { maxAttempts: 4, baseMs: 1, capMs: 5 }, { signal: controller.signal })
          .then(() => 'ok', (e) => e.name);
      };
      for (let i = 0; i < 3000; i += 60) {
        const batch = await Promise.all(Array.from({ length: 60 }, (_, j) => run(i + j)));
        for (const o of batch) outcomes[o] = (outcomes[o] || 0) + 1;
      }
      const dep = await depStatus(where, 'pool');
      const c = dep.counters;
      assert.strictEqual(dep.bulkhead.in_use, 0);
      assert.strictEqual(c.first_attempts, 3000);
      assert.strictEqual(c.successes + c.failures + c.ignored,
                         c.first_attempts + c.retries_granted);
      assert.ok(outcomes.AbortError > 0 && outcomes.ok > 0, JSON.stringify(outcomes));
    },
  );
});
