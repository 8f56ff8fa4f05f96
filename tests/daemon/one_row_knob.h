// The row daemon_one_row_knob_test adds to the policy table: force-included (-include) into
// every source of that test, before anything else, so that every file sees the same table.
#pragma once

#define RETRYD_TEST_ONLY_KNOBS 1
#define RETRYD_POLICY_KNOBS_EXTRA(X) \
  X(test_grace_ms, "test_grace", kDuration, 1500, 0, 10'000, "A knob only this test knows.")
