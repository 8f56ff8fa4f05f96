# frozen_string_literal: true

# Dependency#call: the C retry loop driven from Ruby, on virtual time.
require_relative "test_helper"
require "net/http"
require "timeout"

class CallTest < Minitest::Test
  include RetrydTest::Segments

  Response = Struct.new(:status, :headers)

  # A monotonic clock and a sleep that only advances it.
  class VirtualTime
    attr_reader :sleeps, :now

    def initialize
      @now = 10**12
      @sleeps = []
    end

    def advance(seconds)
      @now += (seconds * 1e9).to_i
    end

    def env
      Retryd::Env.new(now_ns: -> { @now }, sleep: ->(s) { @sleeps << s; advance(s) }, random: -> { 2**63 })
    end
  end

  def setup
    super
    @vt = VirtualTime.new
  end

  def orders(**settings)
    seg = make_segment(orders: { min_calls: 1000 }.merge(settings))
    [Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("orders"), seg]
  end

  # An attempt block returning (or raising) `outcomes` in turn; records its attempts.
  def replay(outcomes, seen = [])
    lambda do |attempt|
      seen << attempt
      @vt.advance(0.005)
      out = outcomes[[attempt.number, outcomes.size - 1].min]
      raise out if out.is_a?(Exception)

      out
    end
  end

  def test_retries_until_success_and_the_observer_sees_each_attempt
    dep, = orders
    infos = []
    seen = []
    policy = Retryd::Policy.new(max_attempts: 5, observer: ->(i) { infos << i })
    res = dep.call(policy, env: @vt.env, &replay([Response.new(503, {}), Response.new(502, {}), Response.new(200, {})], seen))
    assert_equal 200, res.status
    assert_equal [0, 1, 2], seen.map(&:number)
    assert_equal %i[retry retry success], infos.map(&:next)
    assert_equal [503, 502, 200], infos.map(&:status)
    assert_equal :retryable, infos[0].attempt_class
    assert_equal :failure, infos[0].breaker
    assert_equal :admitted, infos[0].decision
    assert_in_delta 0.005, infos[0].latency, 1e-6
    assert_equal infos[0, 2].map(&:wait), @vt.sleeps
    assert(@vt.sleeps.all? { |s| s.positive? && s <= 0.2 })
  end

  def test_retry_after_is_honoured_and_a_net_http_response_is_read
    dep, = orders
    busy = Net::HTTPServiceUnavailable.new("1.1", "503", "busy")
    busy["Retry-After"] = "3"
    ok = Net::HTTPOK.new("1.1", "200", "ok")
    infos = []
    value = dep.call(Retryd::Policy.new(base: 0.01, retry_after_jitter: 0.05, observer: ->(i) { infos << i }),
                     env: @vt.env, &replay([busy, ok]))
    assert_same ok, value
    assert_in_delta 3.0, infos[0].retry_after, 1e-9
    assert_operator @vt.sleeps[0], :>=, 3.0
    assert_operator @vt.sleeps[0], :<=, 3.05
  end

  def test_retry_after_above_the_ceiling_gives_up
    dep, = orders
    e = assert_raises(Retryd::CallFailed) do
      dep.call(env: @vt.env, &replay([Response.new(503, { "Retry-After" => "600" }), Response.new(200, {})]))
    end
    assert_equal :retry_after_too_long, e.result.stop
    assert_equal 503, e.result.value.status
    assert_empty @vt.sleeps
  end

  def test_post_timeout_fails_closed_and_a_refusal_is_retried
    dep, = orders
    e = assert_raises(Retryd::CallFailed) do
      dep.call(method: "POST", env: @vt.env, &replay([Timeout::Error.new("read timed out"), Response.new(200, {})]))
    end
    assert_equal :terminal, e.result.stop
    assert_equal 1, e.result.attempts
    assert_equal :timeout, e.result.last_error
    assert_kind_of Timeout::Error, e.cause
    assert_equal 201, dep.call(method: "POST", idempotency_key: true, env: @vt.env,
                               &replay([Net::ReadTimeout.new, Response.new(201, {})])).status
    assert_equal 201, dep.call(method: "POST", env: @vt.env,
                               &replay([Errno::ECONNREFUSED.new, Response.new(201, {})])).status
  end

  def test_client_error_is_terminal_and_ignored_by_the_breaker
    dep, seg = orders(min_calls: 3, open_for: "60s", open_for_max: "60s")
    10.times do
      e = assert_raises(Retryd::CallFailed) { dep.call(env: @vt.env, &replay([Response.new(404, {})])) }
      assert_equal :terminal, e.result.stop
      assert_equal 404, e.result.last_status
    end
    assert_equal "closed", seg.state("orders")
    3.times { assert_raises(Retryd::CallFailed) { dep.call(max_attempts: 1, env: @vt.env, &replay([[500, {}, []]])) } }
    assert_equal "open", seg.state("orders")
    seen = []
    r = assert_raises(Retryd::Rejected) { dep.call(env: @vt.env, &replay([Response.new(200, {})], seen)) }
    assert_equal :open, r.reason
    assert_equal 0, r.result.attempts
    assert_empty seen
  end

  def test_budget_empty_stops_retries
    seg = make_segment(scarce: { retry_burst: 1, retry_ratio: 0, min_retries_per_sec: 0 })
    dep = Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("scarce")
    e = assert_raises(Retryd::Rejected) { dep.call(max_attempts: 10, env: @vt.env, &replay([Response.new(503, {})])) }
    assert_equal :budget_empty, e.reason
    assert_equal 2, e.result.attempts
  end

  def test_deadline_is_never_overrun_and_attempts_get_their_timeout
    dep, = orders
    start = @vt.now
    timeouts = []
    e = assert_raises(Retryd::CallFailed) do
      dep.call(deadline: 1.0, attempt_timeout: 0.3, max_attempts: 10, base: 0.05, env: @vt.env) do |attempt|
        timeouts << attempt.timeout
        assert_same attempt, Retryd.current_attempt
        refute_nil attempt.deadline_header
        @vt.advance(attempt.timeout)
        raise Errno::ETIMEDOUT
      end
    end
    assert_equal :deadline, e.result.stop
    assert_operator (@vt.now - start) / 1e9, :<=, 1.0
    assert_in_delta 0.3, timeouts[0], 1e-9
    assert_operator timeouts.size, :>=, 2
    assert_nil Retryd.current_attempt
  end

  def test_an_unmapped_exception_propagates_without_retry_and_counts_as_a_failure
    dep, seg = orders(min_calls: 1, open_for: "60s", open_for_max: "60s")
    seen = []
    assert_raises(NoMethodError) { dep.call(env: @vt.env, &replay([NoMethodError.new("bug")], seen)) }
    assert_equal 1, seen.size
    assert_equal "open", seg.state("orders")
  end

  def test_an_observer_error_and_a_cancelling_sleep
    dep, = orders
    boom = Retryd::Policy.new(observer: ->(_) { raise "observer broke" })
    assert_equal "observer broke", assert_raises(RuntimeError) { dep.call(boom, env: @vt.env) { 1 } }.message
    env = Retryd::Env.new(now_ns: -> { @vt.now }, sleep: ->(_) { false })
    e = assert_raises(Retryd::CallFailed) { dep.call(env: env, &replay([Response.new(503, {})])) }
    assert_equal :cancelled, e.result.stop
  end

  def test_classifier_overrides_and_the_retry_callable
    dep, = orders
    table = Retryd::Classifier.new.set_status(404, :retryable, :ignored)
    seen = []
    assert_equal 200, dep.call(classifier: table, env: @vt.env, &replay([Response.new(404, {}), Response.new(200, {})], seen)).status
    assert_equal 2, seen.size
    assert_raises(ArgumentError) { Retryd::Policy.new(jitter: :sideways) }
    assert_raises(ArgumentError) { Retryd::Policy.new(retries: 3) }
    fetch = dep.retry(max_attempts: 2, env: @vt.env) { |attempt, id| attempt.number.zero? ? Response.new(503, {}) : Response.new(200, { "id" => id }) }
    assert_equal 7, fetch.call(7).headers["id"]
  end

  def test_default_classification_of_ruby_exceptions
    c = Retryd::Classify
    assert_equal :dns, c.classify_exception(SocketError.new("getaddrinfo: Name or service not known"))
    assert_equal :connect_refused, c.classify_exception(Errno::ECONNREFUSED.new)
    assert_equal :connection_reset, c.classify_exception(Errno::ECONNRESET.new)
    assert_equal :connection_reset, c.classify_exception(EOFError.new)
    assert_equal :timeout, c.classify_exception(Net::OpenTimeout.new)
    assert_equal :other, c.classify_exception(IOError.new)
    assert_nil c.classify_exception(ArgumentError.new)
    wrapped = begin
      begin
        raise Errno::ECONNREFUSED
      rescue StandardError
        raise IOError, "wrapped"
      end
    rescue IOError => e
      e
    end
    assert_equal :connect_refused, c.classify_exception(wrapped)
  end
end
