'use strict';
// Client, dep.admit, permit.complete and dep.state on real segments (made by
// retryd_test_segment, read back with retryctl) and through a real daemon's socket.

const test = require('node:test');
const assert = require('assert');
const fs = require('fs');
const path = require('path');
const { Worker } = require('worker_threads');
const {
  retryd,
  poll,
  sleep,
  tmpdir,
  makeSegment,
  depStatus,
  liveWorkers,
  startDaemon,
} = require('./harness');

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

test('admit returns a permit, complete reports it once, with the latency it measured', async () => {
  await withSegment({ orders: {} }, async (client, where) => {
    const orders = client.dependency('orders');
    assert.strictEqual(client.dependency('orders'), orders, 'resolved once, then cached');
    assert.strictEqual(client.local, false);
    assert.strictEqual(orders.state, 'closed');
    const measured = orders.admit();
    assert.ok(measured instanceof retryd.Permit);
    assert.strictEqual(measured.probe, false);
    assert.strictEqual(measured.attempt, 0);
    const given = orders.admit();
    await sleep(40);
    measured.complete(); // success, 40 ms or more since its admission
    given.complete('failure', 3); // a latency of its own
    given.complete('success', 1000); // a second call: nothing
    measured.complete('failure');
    assert.strictEqual(measured.done, true);
    const dep = await depStatus(where, 'orders');
    assert.strictEqual(dep.counters.first_attempts, 2);
    assert.strictEqual(dep.counters.successes, 1);
    assert.strictEqual(dep.counters.failures, 1);
    assert.strictEqual(dep.latency.count, 2);
    assert.ok(dep.latency.sum_seconds >= 0.043, `latencies summed ${dep.latency.sum_seconds} s`);
    const le4 = dep.latency.buckets.find((b) => b.le_seconds === 0.004);
    assert.strictEqual(le4.calls, 1, 'the given 3 ms');
  });
});

test('a breaker that trips refuses with reason "open", then lets one probe through', async () => {
  await withSegment(
    {
      flaky: {
        min_calls: 2,
        failure_rate_threshold: 50,
        open_for: '300ms',
        open_for_max: '300ms',
        open_jitter: '0s',
        half_open_probes: 1,
        close_after: 1,
      },
    },
    async (client) => {
      const flaky = client.dependency('flaky');
      flaky.admit().complete('failure');
      flaky.admit().complete('failure');
      let e;
      try {
        flaky.admit();
      } catch (err) {
        e = err;
      }
      assert.ok(e instanceof retryd.RetrydError);
      assert.strictEqual(e.reason, 'open');
      assert.strictEqual(e.dependency, 'flaky');
      assert.strictEqual(e.result, null);
      assert.strictEqual(flaky.state, 'open');
      // Once the open period ends, the next admission is the probe, and no other gets through.
      const probe = await poll(() => {
        try {
          return flaky.admit();
        } catch (err) {
          if (err.reason !== 'open') throw err;
          return null;
        }
      }, 'the half-open probe');
      assert.strictEqual(probe.probe, true);
      assert.strictEqual(flaky.state, 'half_open');
      assert.throws(() => flaky.admit(), { name: 'RejectedError', reason: 'half_open_busy' });
      probe.complete('success');
      assert.strictEqual(flaky.state, 'closed');
      flaky.admit().complete();
    },
  );
});

test('a full bulkhead and an empty retry budget refuse with their reasons', async () => {
  await withSegment(
    {
      pool: { bulkhead_limit: 2, min_calls: 100000 },
      budget: { retry_burst: 1, retry_ratio: 0, min_retries_per_sec: 0, min_calls: 100000 },
    },
    async (client, where) => {
      const pool = client.dependency('pool');
      const a = pool.admit();
      const b = pool.admit();
      assert.throws(() => pool.admit(), { name: 'RejectedError', reason: 'bulkhead_full' });
      assert.strictEqual((await depStatus(where, 'pool')).bulkhead.in_use, 2);
      // Completed in the other order: each permit carries its own lease.
      b.complete();
      a.complete('ignored');
      assert.strictEqual((await depStatus(where, 'pool')).bulkhead.in_use, 0);
      pool.admit().complete();

      const budget = client.dependency('budget');
      budget.admit(1).complete('failure'); // a retry: takes the one token
      assert.throws(() => budget.admit(1), { name: 'RejectedError', reason: 'budget_empty' });
      budget.admit(0).complete(); // a first attempt needs no token
      const dep = await depStatus(where, 'budget');
      assert.strictEqual(dep.retries.granted, 1);
      assert.strictEqual(dep.retries.denied, 1);
    },
  );
});

test('bad input is refused with an error naming it', async () => {
  assert.throws(() => new retryd.Client({ segmnet: 'x' }), /unknown option segmnet/);
  assert.throws(() => new retryd.Client('x'), /options must be an object/);
  await withSegment({ orders: {} }, async (client) => {
    const orders = client.dependency('orders');
    assert.throws(() => orders.admit(-1), /attempt must be an integer >= 0, got -1/);
    assert.throws(() => orders.admit(1.5), TypeError);
    const p = orders.admit();
    assert.throws(
      () => p.complete('fine'),
      /outcome must be "success", "failure" or "ignored", got fine/,
    );
    assert.throws(() => p.complete('success', 'soon'), /latencyMs must be a number/);
    assert.strictEqual(p.done, false);
    p.complete();
    assert.throws(
      () => client.dependency('no spaces allowed'),
      (e) =>
        e instanceof retryd.ClientError &&
        e.code === retryd.constants.EINVAL &&
        /no spaces allowed/.test(e.message),
    );
    assert.throws(() => client.dependency(7), /name must be a string/);
  });
});

test('with no daemon, fallbackToLocal runs on per-process limits, and without it throws', () => {
  const absent = `retryd-nodetest-absent-${process.pid}`;
  assert.throws(
    () => new retryd.Client({ segment: absent, fallbackToLocal: false }),
    (e) =>
      e instanceof retryd.ClientError &&
      e.code === retryd.constants.ENOENT &&
      e.message.includes(absent),
  );
  const client = new retryd.Client({ segment: absent });
  assert.strictEqual(client.local, true);
  client.dependency('orders').admit().complete();
  client.close();
});

test('a closed client says so', async () => {
  await withSegment({ orders: {} }, async (client) => {
    const orders = client.dependency('orders');
    const p = orders.admit();
    client.close();
    client.close();
    assert.throws(() => orders.admit(), /client is closed/);
    assert.throws(() => p.complete(), /client is closed/);
    assert.throws(() => orders.state, /client is closed/);
    assert.throws(() => client.local, /client is closed/);
    await assert.rejects(
      orders.call(() => 1),
      /client is closed/,
    );
  });
});

test("through the daemon's socket, by option or $RETRYD_SOCKET, the process is registered until close", async () => {
  const dir = tmpdir('retryd-node-socket-');
  const daemon = await startDaemon(dir, { orders: {} });
  try {
    const client = new retryd.Client({ socket: daemon.socket, fallbackToLocal: false });
    client.dependency('orders').admit().complete();
    assert.ok((await liveWorkers(daemon))[process.pid], 'retryctl workers lists this process');
    client.close();
    await poll(
      async () => !(await liveWorkers(daemon))[process.pid],
      'the process to leave the registry',
    );

    process.env.RETRYD_SOCKET = daemon.socket;
    try {
      const byEnv = new retryd.Client({ fallbackToLocal: false });
      assert.strictEqual(byEnv.local, false);
      byEnv.dependency('orders').admit().complete();
      assert.ok((await liveWorkers(daemon))[process.pid]);
      const dep = await depStatus(daemon, 'orders');
      assert.strictEqual(dep.counters.successes, 2);
      byEnv.close();
    } finally {
      delete process.env.RETRYD_SOCKET;
    }
  } finally {
    await daemon.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('the addon loads and admits in a worker thread too', async () => {
  await withSegment({ orders: {} }, async (client, where) => {
    const code = `
      const { parentPort, workerData } = require('worker_threads');
      const retryd = require(${JSON.stringify(path.resolve(__dirname, '..'))});
      const c = new retryd.Client({ segment: workerData, fallbackToLocal: false });
      const p = c.dependency('orders').admit();
      p.complete('success', 1);
      c.close();
      parentPort.postMessage('done');`;
    const worker = new Worker(code, { eval: true, workerData: where.segment });
    const said = await new Promise((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
    });
    assert.strictEqual(said, 'done');
    await new Promise((resolve) => worker.once('exit', resolve));
    client.dependency('orders').admit().complete();
    assert.strictEqual((await depStatus(where, 'orders')).counters.successes, 2);
  });
});
