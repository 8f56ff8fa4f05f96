'use strict';
// A PM2 cluster-mode app: pm2-runtime (PM2 in the foreground, as in a container) runs app.js
// with 4 instances (`-i 4`: node:cluster workers of PM2's own daemon, load-balanced on one
// port), each attached to a real retryd's segment by name, against a downstream the test
// controls (server_harness.js says what is checked). PM2 comes from the npm registry:
// $RETRYD_PM2 (tests/bindings/node/install_pm2 prints it), in a PM2_HOME of the test's own.

const { spawn } = require('child_process');
const fs = require('fs');
const path = require('path');
const { serverTests, poll } = require('./server_harness');

const pm2 = process.env.RETRYD_PM2;
if (!pm2 || !fs.existsSync(pm2)) {
  throw new Error("RETRYD_PM2 must name PM2's pm2 program (tests/bindings/node/install_pm2)");
}
const runtime = path.join(path.dirname(pm2), 'pm2-runtime');

serverTests({
  name: 'pm2',
  attach: { socket: false },
  async start(env, dir) {
    const home = path.join(dir, 'pm2-home');
    fs.mkdirSync(home);
    const logPath = path.join(dir, 'pm2.log');
    const log = fs.openSync(logPath, 'w');
    const proc = spawn(
      runtime,
      ['start', path.join(__dirname, 'app.js'), '-i', '4', '--name', 'retryd-app'],
      {
        env: { ...env, PM2_HOME: home, PM2_DISABLE_VERSION_CHECK: 'true' },
        stdio: ['ignore', log, log],
        detached: true, // its own process group: stop() ends PM2 and every worker together
      },
    );
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
          process.kill(-proc.pid, 'SIGINT');
          await poll(() => exited, 'pm2-runtime to stop');
        }
      },
    };
  },
});
