'use strict';
// retryd for Node.js: host-wide retry budgets, circuit breakers and bulkheads for every worker
// of a cluster (node:cluster, PM2), over libretryd's C ABI. See README.md.
//
//   const retryd = require('retryd');
//   const orders = new retryd.Client().dependency('orders');
//   const permit = orders.admit();             // throws RejectedError (e.reason) when refused
//   ... send ...; permit.complete('success');
//   const res = await orders.call(async (attempt) => fetch(url, { signal: attempt.signal }),
//                                 { deadlineMs: 2000 });

const { Client, Dependency, Permit, Attempt } = require('./client');
const errors = require('./errors');
const policy = require('./policy');
const adapters = require('./adapters');
const constants = require('./constants');

module.exports = {
  Client,
  Dependency,
  Permit,
  Attempt,
  AttemptResult: policy.AttemptResult,
  Classifier: policy.Classifier,
  RetrydError: errors.RetrydError,
  LibraryNotFoundError: errors.LibraryNotFoundError,
  ClientError: errors.ClientError,
  RejectedError: errors.RejectedError,
  CallFailedError: errors.CallFailedError,
  defaultInspect: policy.defaultInspect,
  defaultClassifyError: policy.defaultClassifyError,
  DEFAULT_POLICY: policy.DEFAULTS,
  adapters,
  constants,
};
