'use strict';
// The HTTP app each worker runs, under node:cluster (cluster_main.js) and under PM2 in cluster
// mode (pm2.test.js): one retryd Client per worker process, made at start-up (attached through
// $RETRYD_SOCKET or to the segment $RETRYD_SEGMENT), and a downstream at $DOWNSTREAM_URL that
// the test controls. Every answer is JSON with the worker's pid.
//
//   /ping            nothing but the pid
//   /call            one GET of DOWNSTREAM/work through the fetch adapter on "downstream", one
//                    attempt: the status it got, or why the host refused it ("open",
//                    "half_open_busy"), and how many attempts went out
//   /retry           a GET of DOWNSTREAM/fail (always 503) through the fetch adapter on
//                    "budget", up to 10 attempts: retried while the host's retry budget pays
//   /hold?hold=1|0   admit on "slow" (a bulkhead of 1); with hold=1, keep the lease while a GET
//                    of DOWNSTREAM/hold, which the downstream never answers, is in flight

const http = require('http');
const retryd = require(process.env.RETRYD_NODE_PACKAGE);

const client = new retryd.Client({ fallbackToLocal: false });
const downstream = client.dependency('downstream');
const budget = client.dependency('budget');
const slow = client.dependency('slow');
const base = process.env.DOWNSTREAM_URL;
const headers = { 'x-worker-pid': String(process.pid) };
const once = retryd.adapters.fetch(downstream, { maxAttempts: 1, deadlineMs: 30000 });
const retrying = retryd.adapters.fetch(budget, {
  maxAttempts: 10,
  baseMs: 1,
  capMs: 1,
  deadlineMs: 30000,
});

async function call() {
  try {
    const r = await once(`${base}/work`, { headers });
    await r.text();
    return { outcome: r.status, sent: 1 };
  } catch (e) {
    if (e instanceof retryd.RejectedError) return { outcome: e.reason, sent: 0 };
    return { outcome: 'error', error: String(e), sent: 1 };
  }
}

async function retry() {
  try {
    const r = await retrying(`${base}/fail`, { headers });
    await r.text();
    const result = r.retrydResult;
    return {
      stop: result ? result.rejection || result.stop : 'success',
      attempts: result ? result.attempts : 1,
    };
  } catch (e) {
    if (e instanceof retryd.RejectedError) return { stop: e.reason, attempts: 0 };
    return { stop: 'error', error: String(e) };
  }
}

async function hold(keep) {
  let permit;
  try {
    permit = slow.admit();
  } catch (e) {
    if (e instanceof retryd.RejectedError) return { outcome: e.reason };
    throw e;
  }
  try {
    if (keep) await (await fetch(`${base}/hold`, { headers })).text();
    return { outcome: 'success' };
  } finally {
    permit.complete();
  }
}

const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, 'http://app');
  let body;
  try {
    if (url.pathname === '/ping') body = {};
    else if (url.pathname === '/call') body = await call();
    else if (url.pathname === '/retry') body = await retry();
    else if (url.pathname === '/hold') body = await hold(url.searchParams.get('hold') === '1');
    else {
      res.writeHead(404).end();
      return;
    }
  } catch (e) {
    body = { outcome: 'error', error: String(e) };
  }
  body.pid = process.pid;
  res.writeHead(200, { 'content-type': 'application/json', connection: 'close' });
  res.end(JSON.stringify(body));
});
server.listen(Number(process.env.PORT), '127.0.0.1');
