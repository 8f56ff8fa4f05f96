'use strict';

/** The base class of the errors this package throws. */
class RetrydError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = this.constructor.name;
  }
}

/** libretryd could not be loaded ($RETRYD_LIBRARY, else libretryd.so.0). */
class LibraryNotFoundError extends RetrydError {}

/** A cold-path call failed (opening the client, resolving a name): `code` is the C library's
 * RETRYD_E* value (-1 EINVAL ... -6 EIO), the message the library's own. */
class ClientError extends RetrydError {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/** The host refused the attempt: serve a fallback. `reason` is "open" (breaker open or forced
 * open), "half_open_busy" (the half-open probe is out), "bulkhead_full" or "budget_empty" (a
 * retry, and the host's retry budget is spent). From dep.call, `result` is the CallResult (the
 * attempts made before the refusal); from dep.admit it is null. */
class RejectedError extends RetrydError {
  constructor(reason, dependency, result = null, options = undefined) {
    super(dependency ? `${dependency}: rejected: ${reason}` : `rejected: ${reason}`, options);
    this.reason = reason;
    this.dependency = dependency || null;
    this.result = result;
  }
}

/** dep.call gave up: `result.stop` says why ("terminal", "attempts_exhausted", "deadline",
 * "retry_after_too_long", "cancelled"), `result.value` is the last attempt's value (a 4xx
 * response, say); the last attempt's error, if it threw, is `cause` (and `result.error`). */
class CallFailedError extends RetrydError {
  constructor(dependency, result) {
    super(`${dependency}: gave up (${result.stop}) after ${result.attempts} attempt(s), ` +
          `last status ${result.lastStatus}, last error ${result.lastError}`,
          result.error !== undefined ? { cause: result.error } : undefined);
    this.dependency = dependency;
    this.result = result;
  }
}

module.exports = { RetrydError, LibraryNotFoundError, ClientError, RejectedError, CallFailedError };
