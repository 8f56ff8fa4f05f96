'use strict';
// What the node:cluster and PM2 tests share: a downstream the test controls (an HTTP server in
// the test process that counts what reaches it), a private daemon, and the checks both servers
// must pass with 4 workers running app.js:
//   - every worker is a registered process of its own;
//   - the workers trip one breaker together, and all of them are refused by it;
//   - after the downstream recovers, exactly one probe reaches it, however many requests the
//     workers get meanwhile, and the breaker closes;
//   - retries across workers are bounded by the host's retry budget (as retryctl reads it);
//   - a worker killed with SIGKILL while it holds a bulkhead lease gets it back from the daemon,
//     and the server's replacement worker registers.
// Every condition is polled with a generous timeout, never slept for. The daemon's, the
// server's and PM2's logs are in a temporary directory, removed at the end unless
// RETRYD_KEEP_TEST_DIR is set.

const test = require('node:test');
const assert = require('assert');
const fs = require('fs');
const http = require('http');
const path = require('path');
const harness = require('../../../bindings/node/test/harness');

const { poll, retryctl, depStatus, liveWorkers, startDaemon, tmpdir } = harness;
const WORKERS = 4;
const MIN_CALLS = 8;

const DEPENDENCIES = {
  downstream: {
    window: '60s',
    min_calls: MIN_CALLS,
    failure_rate_threshold: 50,
    open_for: '4s',
    open_for_max: '4s',
    open_jitter: '0s',
    half_open_probes: 1,
    close_after: 1,
    probe_timeout: '30s',
  },
  budget: { min_calls: 100000, retry_burst: 4, retry_ratio: 0, min_retries_per_sec: 0 },
  slow: { min_calls: 100000, bulkhead_limit: 1, bulkhead_timeout: '1h' },
};

/** The downstream: /work answers 200 ("up"), 503 ("down"), or, "held", holds the first
 * request until release() and answers the rest 200; /fail always 503; /hold never answers
 * (until close). Counts what reaches each path. */
class Downstream {
  constructor() {
    this.mode = 'up';
    this.count = { work: 0, fail: 0, hold: 0 };
    this.sinceHeld = 0;
    this.heldResponse = null;
    this.holders = [];
    this.probeArrived = null;
    this.server = http.createServer((req, res) => this.answer(req, res));
  }

  async start() {
    await new Promise((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${this.server.address().port}`;
  }

  hold() {
    this.mode = 'held';
    this.sinceHeld = 0;
    this.probeArrived = new Promise((resolve) => {
      this.onProbe = resolve;
    });
  }

  release() {
    this.mode = 'up';
    if (this.heldResponse) this.heldResponse.writeHead(200).end('ok');
    this.heldResponse = null;
  }

  answer(req, res) {
    const pid = Number(req.headers['x-worker-pid']);
    req.resume();
    if (req.url === '/work') {
      this.count.work++;
      if (this.mode === 'down') return res.writeHead(503).end('down');
      if (this.mode === 'held') {
        this.sinceHeld++;
        if (this.heldResponse === null) {
          this.heldResponse = res;
          this.heldPid = pid;
          this.onProbe();
          return undefined;
        }
      }
      return res.writeHead(200).end('ok');
    }
    if (req.url === '/fail') {
      this.count.fail++;
      return res.writeHead(503).end('busy');
    }
    if (req.url === '/hold') {
      this.count.hold++;
      this.holders.push({ pid, res });
      return undefined;
    }
    return res.writeHead(404).end();
  }

  close() {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(resolve));
  }
}

/** GET `p` on the app, on a connection of its own (so the server spreads them over its
 * workers); resolves to the JSON answer. */
function get(port, p) {
  return new Promise((resolve, reject) => {
    const req = http.get(
      { host: '127.0.0.1', port, path: p, agent: false, timeout: 120000 },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          try {
            assert.strictEqual(res.statusCode, 200);
            resolve(JSON.parse(Buffer.concat(chunks).toString()));
          } catch (e) {
            reject(e);
          }
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error(`GET ${p}: no answer`)));
    req.on('error', reject);
  });
}

/** GETs `p` in concurrent bursts until until(answers) holds; resolves to every answer. */
async function spread(port, p, until, what, concurrency = 8) {
  const answers = [];
  await poll(
    async () => {
      if (until(answers)) return true;
      const burst = await Promise.all(Array.from({ length: concurrency }, () => get(port, p)));
      answers.push(...burst);
      return until(answers);
    },
    `${what}; answers so far: ${JSON.stringify(answers.slice(-8))}`,
    harness.TIMEOUT_MS,
    0,
  );
  return answers;
}

const pidsOf = (answers, pred = () => true) => new Set(answers.filter(pred).map((a) => a.pid));

/** Registers the server tests. server: { name, attach ({socket: true} or {socket: false}),
 * start(env) -> a handle with stop() and log() }. */
function serverTests(server) {
  let dir;
  let daemon;
  let downstream;
  let app;
  let port;

  const workers = async (what = `${WORKERS} workers registered`) => {
    const pids = await poll(async () => {
      if (app.exited && app.exited()) throw new Error(`${server.name} exited:\n${app.log()}`);
      const live = Object.keys(await liveWorkers(daemon)).map(Number);
      return live.length === WORKERS ? new Set(live) : null;
    }, what);
    return pids;
  };

  test.before(async () => {
    dir = tmpdir(`retryd-node-${server.name}-`);
    daemon = await startDaemon(dir, DEPENDENCIES, server.attach);
    downstream = new Downstream();
    await downstream.start();
    port = await freePort();
    const env = {
      ...process.env,
      PORT: String(port),
      DOWNSTREAM_URL: downstream.url,
      RETRYD_NODE_PACKAGE: path.resolve(__dirname, '../../../bindings/node'),
      RETRYD_SOCKET: daemon.socket || '',
      RETRYD_SEGMENT: daemon.segment || '',
    };
    app = await server.start(env, dir);
    await workers();
    await poll(async () => {
      try {
        return await get(port, '/ping');
      } catch {
        return null; // not listening yet
      }
    }, `${server.name} to answer`);
  });

  test.after(async () => {
    try {
      if (downstream) downstream.release();
      if (app) await app.stop();
    } finally {
      if (downstream) await downstream.close();
      if (daemon) await daemon.stop();
      if (dir && !process.env.RETRYD_KEEP_TEST_DIR)
        fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('every worker serves, and is a registered process of its own', async () => {
    const pids = await workers();
    const answers = await spread(
      port,
      '/ping',
      (a) => [...pids].every((p) => pidsOf(a).has(p)),
      'a request through every worker',
    );
    assert.ok(
      [...pidsOf(answers)].every((p) => pids.has(p)),
      'only registered workers answer',
    );
    const listed = await liveWorkers(daemon);
    assert.strictEqual(
      new Set([...pids].map((p) => listed[p].slot)).size,
      WORKERS,
      'one registry slot each',
    );
  });

  test('the workers trip one breaker together, and all of them are refused by it', async (t) => {
    const pids = await workers();
    downstream.mode = 'down';
    const answers = await spread(
      port,
      '/call',
      (a) => [...pids].every((p) => pidsOf(a, (x) => x.outcome === 'open').has(p)),
      'every worker to find the breaker open',
    );
    const failed = answers.filter((a) => a.outcome === 503);
    const refused = answers.filter((a) => a.outcome === 'open');
    assert.strictEqual(failed.length + refused.length, answers.length, JSON.stringify(answers));
    // No worker failed often enough to trip a breaker of its own: they tripped it together.
    const perWorker = {};
    for (const a of failed) perWorker[a.pid] = (perWorker[a.pid] || 0) + 1;
    assert.ok(Object.keys(perWorker).length >= 2, `failures from ${JSON.stringify(perWorker)}`);
    assert.ok(
      Math.max(...Object.values(perWorker)) < MIN_CALLS,
      `failures per worker ${JSON.stringify(perWorker)}`,
    );
    assert.ok(failed.length >= MIN_CALLS);
    const dep = await depStatus(daemon, 'downstream');
    assert.strictEqual(dep.breaker.state, 'open');
    assert.strictEqual(dep.counters.opened, 1);
    // One breaker counted every worker's calls, as the downstream counted what reached it.
    assert.strictEqual(dep.counters.failures, failed.length);
    assert.strictEqual(downstream.count.work, failed.length);
    assert.strictEqual(dep.counters.first_attempts, failed.length);
    assert.strictEqual(dep.counters.rejected_open, refused.length);
    t.diagnostic(
      `${failed.length} failures tripped the breaker (per worker: ${JSON.stringify(perWorker)}), ` +
        `then ${refused.length} refusals from ${pidsOf(refused).size} workers`,
    );
  });

  test('after the downstream recovers, exactly one probe reaches it, and the breaker closes', async (t) => {
    const pids = await workers();
    const before = await poll(async () => {
      const d = await depStatus(daemon, 'downstream');
      return d.breaker.state === 'open' && d.breaker.probes_in_flight === 0 ? d : null;
    }, 'the breaker open with no probe out');
    downstream.hold(); // it answers again, but holds the first request that reaches it

    // One request at a time, so the request that carries the probe is known.
    let probeRequest = null;
    await poll(async () => {
      const request = get(port, '/call');
      const first = await Promise.race([
        request.then((a) => ({ a })),
        downstream.probeArrived.then(() => ({ probe: true })),
      ]);
      if (first.probe) {
        probeRequest = request;
        return true;
      }
      assert.strictEqual(first.a.outcome, 'open');
      return false;
    }, 'the open period to end and the probe to reach the downstream');

    // While the probe is out, every worker, the probe's own included, refuses every request.
    const busy = await spread(
      port,
      '/call',
      (a) => a.length >= 32 && [...pids].every((p) => pidsOf(a).has(p)),
      'every worker to answer while the probe is out',
    );
    assert.deepStrictEqual([...new Set(busy.map((a) => a.outcome))], ['half_open_busy']);
    assert.strictEqual(downstream.sinceHeld, 1, 'one request reached the recovered downstream');

    downstream.release();
    const probe = await probeRequest;
    assert.strictEqual(probe.outcome, 200);
    assert.strictEqual(probe.pid, downstream.heldPid);
    const after = await poll(async () => {
      const d = await depStatus(daemon, 'downstream');
      return d.breaker.state === 'closed' ? d : null;
    }, 'the breaker to close');
    assert.strictEqual(after.counters.probes_granted - before.counters.probes_granted, 1);
    assert.strictEqual(after.counters.closed - before.counters.closed, 1);
    assert.strictEqual(after.counters.rejected_half_open_busy, busy.length);
    const served = await spread(
      port,
      '/call',
      (a) => [...pids].every((p) => pidsOf(a, (x) => x.outcome === 200).has(p)),
      'every worker to be served again',
    );
    assert.ok(
      served.every((a) => a.outcome === 200),
      JSON.stringify(served),
    );
    t.diagnostic(
      `while the probe of worker ${probe.pid} was out, ${busy.length} requests to ` +
        `${pidsOf(busy).size} workers were refused (half_open_busy) and 1 reached the downstream`,
    );
  });

  test("retries across workers are bounded by the host's retry budget", async (t) => {
    const pids = await workers();
    const answers = await spread(
      port,
      '/retry',
      (a) => [...pids].every((p) => pidsOf(a, (x) => x.stop === 'budget_empty').has(p)),
      'every worker to find the retry budget empty',
    );
    assert.ok(
      answers.every((a) => a.stop === 'budget_empty' || a.stop === 'attempts_exhausted'),
      JSON.stringify(answers),
    );
    const dep = await depStatus(daemon, 'budget');
    const burst = dep.retry_budget.burst;
    assert.strictEqual(burst, 4);
    // The host's tokens, and no more, whichever workers made the retries: per process, each
    // worker would have made up to 9 retries of every request.
    const retries = answers.reduce((n, a) => n + a.attempts - 1, 0);
    assert.strictEqual(retries, burst);
    assert.strictEqual(dep.retries.granted, burst);
    assert.strictEqual(dep.retries.denied, answers.filter((a) => a.stop === 'budget_empty').length);
    assert.strictEqual(dep.counters.first_attempts, answers.length);
    assert.strictEqual(downstream.count.fail, answers.length + burst);
    assert.ok(dep.retry_budget.tokens_available < 1);
    const byWorker = {};
    for (const a of answers) byWorker[a.pid] = (byWorker[a.pid] || 0) + a.attempts - 1;
    t.diagnostic(
      `${answers.length} requests, ${retries} retries in all (the budget's burst: ${burst}; ` +
        `per worker: ${JSON.stringify(byWorker)})`,
    );
  });

  test('a worker killed with SIGKILL gives its bulkhead lease back, through the daemon', async (t) => {
    const pids = await workers();
    const held = get(port, '/hold?hold=1').then(
      () => null,
      (e) => e,
    ); // its worker dies
    const holder = await poll(
      () => downstream.holders.length > 0 && downstream.holders[0].pid,
      'a worker to hold the bulkhead lease',
    );
    assert.ok(pids.has(holder));
    assert.strictEqual((await depStatus(daemon, 'slow')).bulkhead.in_use, 1);
    assert.strictEqual((await liveWorkers(daemon))[holder].bulkhead_leases, 1);
    // The host-wide bulkhead of one is full for every worker.
    const full = await spread(port, '/hold?hold=0', (a) => a.length >= 8, 'refusals');
    assert.ok(
      full.every((a) => a.outcome === 'bulkhead_full'),
      JSON.stringify(full),
    );
    const reclaimed = (await depStatus(daemon, 'slow')).counters.leases_reclaimed_dead;

    process.kill(holder, 'SIGKILL');
    await poll(
      async () => (await depStatus(daemon, 'slow')).bulkhead.in_use === 0,
      "the daemon to free the dead worker's lease",
    );
    assert.strictEqual(
      (await depStatus(daemon, 'slow')).counters.leases_reclaimed_dead,
      reclaimed + 1,
    );
    assert.ok(await held, "the killed worker's request failed");
    // The server replaces the worker, which registers; the lease is there for any worker.
    const now = await poll(async () => {
      const live = await workers('a replacement worker');
      return live.has(holder) ? null : live;
    }, 'the dead worker to leave the registry and a replacement to join it');
    assert.strictEqual(now.size, WORKERS);
    const ok = await get(port, '/hold?hold=0');
    assert.strictEqual(ok.outcome, 'success');
    t.diagnostic(
      `worker ${holder} killed holding the lease; reclaimed by the daemon; ` +
        `workers now ${[...now].join(', ')}`,
    );
  });
}

function freePort() {
  return new Promise((resolve) => {
    const s = http.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

module.exports = { serverTests, poll, retryctl, WORKERS };
