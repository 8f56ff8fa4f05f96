'use strict';
// A node:cluster server: the primary forks $WORKERS (default 4) workers running app.js, which
// share one listening port, and replaces a worker that dies, as a production primary does.
// SIGTERM stops them all.

const cluster = require('cluster');
const path = require('path');

const workers = Number(process.env.WORKERS || 4);
let stopping = false;
cluster.setupPrimary({ exec: path.join(__dirname, 'app.js') });
for (let i = 0; i < workers; i++) cluster.fork();
cluster.on('exit', (worker, code, signal) => {
  if (stopping) return;
  console.log(`worker ${worker.process.pid} died (${signal || code}); forking another`);
  cluster.fork();
});
process.on('SIGTERM', () => {
  stopping = true;
  for (const worker of Object.values(cluster.workers)) worker.process.kill('SIGTERM');
  cluster.disconnect(() => process.exit(0));
});
