/* Compiled as C: proves retryd_policy.h is a C header, and drives a retry decision the way a
 * C worker (or a binding's glue) would. c_policy_test.cc checks the results. */
#include "retryd/retryd_policy.h"

#include <string.h>

/* Returns 0 when every step gave what it should, else the number of the step that did not. */
int retryd_policy_test_from_c(void) {
  int attempt_class = -1, breaker_outcome = -1;
  if (retryd_classify("POST", 503, RETRYD_ERROR_NONE, 0, &attempt_class, &breaker_outcome) !=
      RETRYD_POLICY_OK) {
    return 1;
  }
  if (attempt_class != RETRYD_ATTEMPT_TERMINAL) return 2;
  if (breaker_outcome != RETRYD_BREAKER_OUTCOME_FAILURE) return 3;

  int64_t retry_after_ms = -1;
  if (retryd_parse_retry_after("2", NULL, 0, RETRYD_RETRY_AFTER_DEFAULT_MAX_WAIT_MS,
                               &retry_after_ms) != RETRYD_POLICY_OK) {
    return 4;
  }
  if (retry_after_ms != 2000) return 5;

  int64_t backoff_ns = -1, wait_ns = -1;
  if (retryd_backoff_ns(RETRYD_JITTER_FULL, 100000000, 10000000000, 0, 0, retryd_random(),
                        &backoff_ns) != RETRYD_POLICY_OK) {
    return 6;
  }
  if (backoff_ns < 0 || backoff_ns > 100000000) return 7;
  if (retryd_merge_wait_ns(backoff_ns, retry_after_ms * 1000000, 0, 0, &wait_ns) !=
      RETRYD_POLICY_OK) {
    return 8;
  }
  if (wait_ns != 2000000000) return 9;

  retryd_deadline deadline;
  int64_t now = retryd_monotonic_now_ns();
  if (retryd_deadline_start(&deadline, 1500000000, now) != RETRYD_POLICY_OK) return 10;
  if (retryd_deadline_can_finish(&deadline, now, wait_ns) != 0) return 11;

  char header[RETRYD_DEADLINE_HEADER_BUFSIZE];
  if (retryd_format_deadline_header(retryd_deadline_remaining_ns(&deadline, now), header,
                                    sizeof header) != 5) {
    return 12;
  }
  if (strcmp(header, "1500m") != 0) return 13;
  if (strcmp(RETRYD_DEADLINE_HEADER_NAME, "grpc-timeout") != 0) return 14;
  return 0;
}
