# The retry-policy toolkit: backoff and jitter, Retry-After, classification, deadlines, and
# their C ABI. Pure functions of their inputs (no shared memory), compiled into libretryd.
# Paths are relative to client/.
set(RETRYD_POLICY_SOURCES
  policy/backoff.cc
  policy/c_policy.cc
  policy/classify.cc
  policy/deadline.cc
  policy/retry_after.cc
)
set(RETRYD_POLICY_HEADERS
  include/retryd/backoff.h
  include/retryd/classify.h
  include/retryd/deadline.h
  include/retryd/parse_error.h
  include/retryd/retry_after.h
  include/retryd/retryd_policy.h
)
