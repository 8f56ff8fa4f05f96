# frozen_string_literal: true

# Every constant the gem copies from the C headers has the headers' value: ruby-ffi has no
# header parser, so a value changed in retryd.h, retryd_policy.h or retryd_call.h and not here
# would silently mean something else.
require_relative "test_helper"

class ConstantsTest < Minitest::Test
  HEADERS = File.join(RetrydTest::ROOT, "client", "include", "retryd")
  DEFINE = /^#define RETRYD_([A-Z0-9_]+)\s+\(?(-?\d+)\)?/.freeze

  def header_values
    %w[retryd.h retryd_policy.h retryd_call.h].each_with_object({}) do |name, values|
      File.read(File.join(HEADERS, name)).scan(DEFINE) { |key, value| values[key] = Integer(value) }
    end
  end

  def copied
    Retryd::Native.constants.grep(/\A[A-Z0-9_]+\z/).to_h { |c| [c.to_s, Retryd::Native.const_get(c)] }
                  .select { |_, v| v.is_a?(Integer) }.reject { |k, _| k == "NO_TIMEOUT" }
  end

  def test_every_integer_constant_matches_its_header
    values = header_values
    refute_empty copied
    copied.each do |key, value|
      assert values.key?(key), "Native::#{key} has no RETRYD_#{key} in the headers"
      assert_equal values[key], value, "Native::#{key} = #{value}, but RETRYD_#{key} = #{values[key]}"
    end
  end

  def test_every_decision_outcome_error_and_stop_of_the_headers_is_copied
    values = header_values
    wanted = values.keys.grep(/\A(ADMITTED|REJECTED_|STATE_|ERROR_|ATTEMPT_|STOP_|JITTER_|BREAKER_OUTCOME_|E[A-Z]+\z)/)
    wanted -= %w[EMPTY] # not a define of its own
    wanted.reject! { |k| k.start_with?("POLICY_") }
    missing = wanted - copied.keys
    assert_empty missing, "defined in the headers but not in Retryd::Native"
    %w[SUCCESS FAILURE IGNORED OK].each { |k| assert_equal values[k], copied[k] }
  end

  def test_name_tables_match_the_constants
    assert_equal({ none: 0, full: 1, equal: 2, decorrelated: 3 },
                 Retryd::JITTERS.transform_values { |v| v })
    values = header_values
    Retryd::JITTERS.each { |name, v| assert_equal values["JITTER_#{name.upcase}"], v }
    Retryd::ERROR_KINDS.each { |name, v| assert_equal values["ERROR_#{name.upcase}"], v }
    Retryd::CLASSES.each { |name, v| assert_equal values["ATTEMPT_#{name.upcase}"], v }
    Retryd::OUTCOMES.each { |name, v| assert_equal values["BREAKER_OUTCOME_#{name.upcase}"], v }
    Retryd::ADMISSIONS.each do |v, name|
      key = v <= 1 ? name.to_s.upcase : "REJECTED_#{name.upcase}"
      assert_equal values[key], v, name
    end
    Retryd::STOPS.each do |v, name|
      key = name == :retry ? "STOP_NONE" : "STOP_#{name.upcase}"
      assert_equal values[key], v, name
    end
  end

  def test_no_timeout_is_int64_max
    assert_match(/#define RETRYD_NO_TIMEOUT INT64_MAX/, File.read(File.join(HEADERS, "retryd_call.h")))
    assert_equal 2**63 - 1, Retryd::Native::NO_TIMEOUT
  end

  def test_struct_sizes_match_the_c_layout
    assert_equal 48, Retryd::Native::Permit.size
    assert_equal 16, Retryd::Native::Options.size
    assert_equal 8 + 6 * 8 + 8 + 8 + 8 + 8, Retryd::Native::CallPolicy.size
    assert_equal 40, Retryd::Native::AttemptOut.size
    assert_equal 56, Retryd::Native::AttemptInfo.size
    assert_equal 40, Retryd::Native::CallEnv.size
    assert_equal 32, Retryd::Native::CallResult.size
    # retryd_permit_t's comment: the struct never changes size; check the header still says so.
    text = File.read(File.join(HEADERS, "retryd.h"))
    assert_match(/int32_t decision;\s*uint32_t reserved;\s*uint64_t opaque\[5\];/, text)
  end
end
