'use strict';
// The fetch and axios adapters against a real HTTP server on 127.0.0.1 that plays a script of
// replies per path, on a real segment. The same scenarios as the other bindings' adapters.

const test = require('node:test');
const assert = require('assert');
const http = require('http');
const { retryd, makeSegment, depStatus } = require('./harness');

const axios = require('axios'); // Debian's node-axios, through NODE_PATH=/usr/share/nodejs

/** An HTTP server that answers each path from its script (the last reply repeats), records
 * every request, and listens only when told to: before, a connection is refused. */
class Server {
  constructor() {
    this.scripts = new Map();
    this.requests = [];
    this.server = http.createServer((req, res) => this.answer(req, res));
    this.port = 0;
  }

  async reserve() {
    await new Promise((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = this.server.address().port;
    await new Promise((resolve) => this.server.close(resolve));
  }

  listen() {
    if (!this.server.listening) this.server.listen(this.port, '127.0.0.1');
  }

  stop() {
    this.server.closeAllConnections();
    return new Promise((resolve) =>
      this.server.listening ? this.server.close(resolve) : resolve(),
    );
  }

  script(path, ...replies) {
    this.scripts.set(path, replies);
    return `http://127.0.0.1:${this.port}${path}`;
  }

  to(path) {
    return this.requests.filter((r) => r.path === path);
  }

  answer(req, res) {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      this.requests.push({
        path: req.url,
        method: req.method,
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      });
      const replies = this.scripts.get(req.url) || [{ status: 404 }];
      const reply = replies.length > 1 ? replies.shift() : replies[0];
      if (reply.hang) return; // never answers: the attempt's time runs out
      res.writeHead(reply.status, reply.headers || {});
      res.end(reply.body || '');
    });
  }
}

// Each adapter as one interface: request(dep, policy, method, url, {headers, body}) resolves to
// {status, body, response}; `connectError(e)` says whether e is the client's own refusal.
const ADAPTERS = {
  fetch: {
    async request(dep, policy, method, url, { headers = {}, body } = {}) {
      const response = await retryd.adapters.fetch(dep, policy)(url, { method, headers, body });
      return { status: response.status, body: await response.text(), response };
    },
    connectError: (e) =>
      e instanceof TypeError &&
      e.message === 'fetch failed' &&
      e.cause &&
      e.cause.code === 'ECONNREFUSED',
  },
  axios: {
    async request(dep, policy, method, url, { headers = {}, body } = {}) {
      const instance = axios.create({
        adapter: retryd.adapters.axios(axios, dep, policy),
        validateStatus: () => true,
        responseType: 'text',
      });
      const response = await instance.request({ method, url, headers, data: body });
      return { status: response.status, body: response.data, response };
    },
    connectError: (e) => axios.isAxiosError(e) && e.code === 'ECONNREFUSED',
  },
};

let seg;
let client;
let server;
const PLENTY = { min_calls: 100000, retry_burst: 100000, min_retries_per_sec: 100000 };
test.before(async () => {
  const deps = {};
  for (const name of Object.keys(ADAPTERS)) {
    for (const d of ['refused', 'busy', 'notfound', 'post', 'stream'])
      deps[`${name}_${d}`] = PLENTY;
    deps[`${name}_open`] = {
      min_calls: 2,
      failure_rate_threshold: 50,
      open_for: '60s',
      open_for_max: '60s',
    };
    for (const d of ['budget', 'budget_err', 'budget_axios_error']) {
      deps[`${name}_${d}`] = {
        min_calls: 100000,
        retry_burst: 1,
        retry_ratio: 0,
        min_retries_per_sec: 0,
      };
    }
  }
  seg = await makeSegment(deps);
  client = new retryd.Client({ segment: seg.name, fallbackToLocal: false });
  server = new Server();
  await server.reserve();
  server.listen();
});
test.after(async () => {
  client.close();
  await server.stop();
  await seg.close();
});

const grpcMs = (text) => {
  const m = /^(\d{1,8})([HMSmun])$/.exec(text);
  assert.ok(m, text);
  return Number(m[1]) * { H: 3.6e6, M: 6e4, S: 1e3, m: 1, u: 1e-3, n: 1e-6 }[m[2]];
};

/** A dependency whose budget is spent: the next retry is refused. */
function budgetEmpty(name) {
  const dep = client.dependency(name);
  dep.admit(1).complete();
  assert.throws(() => dep.admit(1), { reason: 'budget_empty' });
  return dep;
}

for (const [name, adapter] of Object.entries(ADAPTERS)) {
  const dep = (d) => client.dependency(`${name}_${d}`);

  test(`${name}: a refused connection is retried, even for a POST`, async () => {
    const late = new Server(); // listens after the first attempt was refused
    await late.reserve();
    const infos = [];
    const url = late.script('/orders', { status: 201, body: 'created' });
    const policy = {
      maxAttempts: 3,
      baseMs: 10,
      deadlineMs: 30000,
      observer: (i) => {
        infos.push(i);
        late.listen();
      },
    };
    try {
      const { status, body } = await adapter.request(dep('refused'), policy, 'POST', url, {
        body: '{}',
      });
      assert.deepStrictEqual([status, body], [201, 'created']);
    } finally {
      await late.stop();
    }
    assert.deepStrictEqual(
      infos.map((i) => [i.error, i.next]),
      [
        ['connect_refused', 'retry'],
        ['none', 'success'],
      ],
    );
    assert.deepStrictEqual(
      late.to('/orders').map((r) => [r.method, r.body]),
      [['POST', '{}']],
    );
  });

  test(`${name}: a 503's Retry-After is waited for, and each attempt says its time downstream`, async () => {
    const infos = [];
    const url = server.script(
      `/${name}/busy`,
      { status: 503, body: 'later', headers: { 'Retry-After': '1' } },
      { status: 200, body: 'ok' },
    );
    const policy = {
      maxAttempts: 3,
      baseMs: 10,
      retryAfterJitterMs: 50,
      deadlineMs: 30000,
      observer: (i) => infos.push([performance.now(), i]),
    };
    const { status, body } = await adapter.request(dep('busy'), policy, 'GET', url);
    assert.deepStrictEqual([status, body], [200, 'ok']);
    const [[busyAt, busy], [okAt, ok]] = infos;
    assert.strictEqual(busy.status, 503);
    assert.strictEqual(busy.retryAfterMs, 1000);
    assert.ok(busy.waitMs >= 1000);
    assert.strictEqual(ok.status, 200);
    assert.ok(okAt - busyAt >= 999, `${okAt - busyAt} ms between the attempts`);
    const left = server.to(`/${name}/busy`).map((r) => grpcMs(r.headers['grpc-timeout']));
    assert.ok(left[0] > 20000 && left[0] <= 30000, `first attempt: ${left[0]} ms`);
    assert.ok(left[1] <= left[0] - 1000, `second attempt: ${left[1]} ms`);
  });

  test(`${name}: a 4xx is returned and not counted as a failure`, async () => {
    const url = server.script(`/${name}/orders/7`, { status: 404, body: 'no such order' });
    const { status, body } = await adapter.request(
      dep('notfound'),
      { baseMs: 10, deadlineMs: 30000 },
      'GET',
      url,
    );
    assert.deepStrictEqual([status, body], [404, 'no such order']);
    assert.strictEqual(server.to(`/${name}/orders/7`).length, 1);
    const s = await depStatus({ segment: seg.name }, `${name}_notfound`);
    assert.strictEqual(s.counters.ignored, 1);
    assert.strictEqual(s.counters.failures, 0);
  });

  test(`${name}: a POST that timed out is not retried without an idempotency key, and is with one`, async () => {
    const url = server.script(`/${name}/pay`, { hang: true });
    const policy = { maxAttempts: 3, baseMs: 10, attemptTimeoutMs: 100, deadlineMs: 30000 };
    await assert.rejects(
      adapter.request(dep('post'), policy, 'POST', url, { body: 'x' }),
      (e) =>
        e.retrydResult &&
        e.retrydResult.stop === 'terminal' &&
        e.retrydResult.lastError === 'timeout',
    );
    assert.strictEqual(server.to(`/${name}/pay`).length, 1);
    await assert.rejects(
      adapter.request(dep('post'), policy, 'POST', url, {
        body: 'x',
        headers: { 'Idempotency-Key': 'k1' },
      }),
      (e) => e.retrydResult && e.retrydResult.stop === 'attempts_exhausted',
    );
    assert.strictEqual(server.to(`/${name}/pay`).length, 4);
  });

  test(`${name}: a refused first attempt rejects with RejectedError and sends nothing`, async () => {
    const open = dep('open');
    open.admit().complete('failure');
    open.admit().complete('failure');
    const url = server.script(`/${name}/closed`, { status: 200 });
    await assert.rejects(
      adapter.request(open, { deadlineMs: 30000 }, 'GET', url),
      (e) => e instanceof retryd.RejectedError && e.reason === 'open',
    );
    assert.strictEqual(server.to(`/${name}/closed`).length, 0);
  });

  // The same scenario in every binding's adapters: the first attempt gets a 503, the host
  // refuses the retry (budget empty), and the client's call returns that 503.
  test(`${name}: a retry refused by the budget returns the 503`, async () => {
    const url = server.script(
      `/${name}/budget`,
      { status: 503, body: 'busy' },
      { status: 200, body: 'ok' },
    );
    const { status, body, response } = await adapter.request(
      budgetEmpty(`${name}_budget`),
      { maxAttempts: 3, baseMs: 10, deadlineMs: 30000 },
      'GET',
      url,
    );
    assert.deepStrictEqual([status, body], [503, 'busy']);
    assert.strictEqual(server.to(`/${name}/budget`).length, 1);
    const r = response.retrydResult;
    assert.deepStrictEqual([r.stop, r.rejection, r.attempts], ['rejected', 'budget_empty', 1]);
  });

  // The first attempt's connection is refused, the host refuses the retry: the client's own
  // error.
  test(`${name}: a retry refused by the budget throws the client's error`, async () => {
    const gone = new Server(); // a port nobody listens on: the connection is refused
    await gone.reserve();
    const url = gone.script(`/${name}/gone`, { status: 200 });
    const e = await adapter
      .request(
        budgetEmpty(`${name}_budget_err`),
        { maxAttempts: 3, baseMs: 10, deadlineMs: 30000 },
        'GET',
        url,
      )
      .catch((err) => err);
    assert.ok(adapter.connectError(e), String(e));
    const r = e.retrydResult;
    assert.deepStrictEqual(
      [r.stop, r.rejection, r.attempts, r.lastError],
      ['rejected', 'budget_empty', 1, 'connect_refused'],
    );
  });
}

test('axios: with its default validateStatus, the last 503 is its own AxiosError', async () => {
  const url = server.script('/axios/strict', { status: 503, body: 'busy' });
  const instance = axios.create({
    adapter: retryd.adapters.axios(axios, budgetEmpty('axios_budget_axios_error'), {
      maxAttempts: 3,
      baseMs: 10,
      deadlineMs: 30000,
    }),
  });
  const e = await instance.get(url).catch((err) => err);
  assert.ok(axios.isAxiosError(e), String(e));
  assert.strictEqual(e.response.status, 503);
  assert.strictEqual(e.response.data, 'busy');
  assert.strictEqual(e.retrydResult.rejection, 'budget_empty');
});

test('fetch: a Request is sent whole on each attempt', async () => {
  const url = server.script('/fetch/request', { status: 503 }, { status: 200, body: 'ok' });
  const request = new Request(url, { method: 'PUT', body: 'payload', headers: { 'x-mine': '1' } });
  const response = await retryd.adapters.fetch(client.dependency('fetch_busy'), { baseMs: 10 })(
    request,
  );
  assert.strictEqual(await response.text(), 'ok');
  assert.deepStrictEqual(
    server.to('/fetch/request').map((r) => [r.method, r.body, r.headers['x-mine']]),
    [
      ['PUT', 'payload', '1'],
      ['PUT', 'payload', '1'],
    ],
  );
  assert.strictEqual(request.bodyUsed, false, "the caller's Request is left unread");
});

test('fetch: a body that cannot be sent twice gets one attempt', async () => {
  const url = server.script('/fetch/stream', { status: 503 });
  const body = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('once'));
      c.close();
    },
  });
  const response = await retryd.adapters.fetch(client.dependency('fetch_stream'), {
    maxAttempts: 3,
    baseMs: 10,
    idempotencyKey: true,
  })(url, { method: 'PUT', body, duplex: 'half' });
  assert.strictEqual(response.status, 503);
  assert.strictEqual(response.retrydResult.attempts, 1);
  assert.deepStrictEqual(
    server.to('/fetch/stream').map((r) => r.body),
    ['once'],
  );
});

test('the package loads no HTTP client of its own', () => {
  const { execFileSync } = require('child_process');
  const out = execFileSync(process.execPath, [
    '-e',
    `require(${JSON.stringify(require.resolve('..'))});` +
      'console.log(Object.keys(require.cache).filter((f) => /axios/.test(f)).length)',
  ]);
  assert.strictEqual(out.toString().trim(), '0');
  assert.throws(
    () => retryd.adapters.axios({}, client.dependency('fetch_stream')),
    /the axios module/,
  );
  assert.throws(() => retryd.adapters.fetch(null), /a retryd Dependency/);
  assert.throws(
    () => retryd.adapters.fetch(client.dependency('fetch_stream'), null, { retries: 1 }),
    /unknown option retries/,
  );
});
