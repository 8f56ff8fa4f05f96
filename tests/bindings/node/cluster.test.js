'use strict';
// A node:cluster HTTP server: cluster_main.js forks 4 workers running app.js on one port, each
// attached to a real retryd through its socket (the packaged way), against a downstream the
// test controls (server_harness.js says what is checked).

const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');
const { serverTests, poll } = require('./server_harness');

serverTests({
  name: 'cluster',
  attach: { socket: true },
  async start(env, dir) {
    const logPath = path.join(dir, 'cluster.log');
    const log = fs.openSync(logPath, 'w');
    const proc = spawn(process.execPath, [path.join(__dirname, 'cluster_main.js')], {
      env: { ...env, WORKERS: '4' },
      stdio: ['ignore', log, log],
    });
    fs.closeSync(log);
    let exited = false;
    proc.once('exit', () => {
      exited = true;
    });
    return {
      exited: () => exited,
      log: () => fs.readFileSync(logPath, 'utf8'),
      async stop() {
        if (!exited) {
          proc.kill('SIGTERM');
          await poll(() => exited, 'the cluster to stop');
        }
      },
    };
  },
});
