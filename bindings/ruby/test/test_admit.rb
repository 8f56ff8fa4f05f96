# frozen_string_literal: true

# Client, Dependency#admit and rejections against real segments.
require_relative "test_helper"

class AdmitTest < Minitest::Test
  include RetrydTest::Segments

  class Down < StandardError; end

  def client_for(seg)
    Retryd::Client.new(segment: seg.name, fallback_to_local: false)
  end

  def test_block_success_and_exceptions_open_the_breaker_and_are_re_raised
    seg = make_segment(orders: { min_calls: 2, open_for: "60s", open_for_max: "60s" })
    client = client_for(seg)
    refute client.local?
    orders = client.dependency("orders")
    assert_same orders, client.dependency("orders")
    assert_equal 42, client.dependency("other").admit { |permit| refute permit.probe?; 42 }
    2.times { assert_raises(Down) { orders.admit { raise Down, "down" } } }
    assert_equal "open", seg.state("orders")
    e = assert_raises(Retryd::Rejected) { orders.admit { flunk "must not run" } }
    assert_equal :open, e.reason
    assert_equal "orders", e.dependency
    assert_kind_of Retryd::Error, e
    client.close
  end

  def test_ignore_and_fail_choose_the_outcome
    seg = make_segment(orders: { min_calls: 2, open_for: "60s", open_for_max: "60s" })
    orders = client_for(seg).dependency("orders")
    5.times do
      assert_raises(ArgumentError) do
        orders.admit { |permit| permit.ignore!; raise ArgumentError, "bad request" }
      end
    end
    assert_equal "closed", seg.state("orders")
    2.times { orders.admit(&:fail!) }
    assert_equal "open", seg.state("orders")
  end

  def test_succeed_wins_over_an_exception
    seg = make_segment(orders: { min_calls: 2, open_for: "60s", open_for_max: "60s" })
    orders = client_for(seg).dependency("orders")
    3.times { assert_raises(Down) { orders.admit { |p| p.succeed!; raise Down } } }
    assert_equal "closed", seg.state("orders")
  end

  def test_permit_form_and_bulkhead_full
    seg = make_segment(orders: { bulkhead_limit: 2 })
    orders = client_for(seg).dependency("orders")
    a = orders.admit
    b = orders.admit
    e = assert_raises(Retryd::Rejected) { orders.admit }
    assert_equal :bulkhead_full, e.reason
    a.complete(:ignored)
    a.complete # a second call is a no-op
    assert a.completed?
    orders.admit { nil }
    b.complete(:success)
    c = orders.admit
    d = orders.admit
    [c, d].each(&:complete)
  end

  def test_forced_open_and_budget_empty
    seg = make_segment(closed: { mode: "forced-open" },
                       scarce: { retry_burst: 1, retry_ratio: 0, min_retries_per_sec: 0 })
    client = client_for(seg)
    assert_equal :open, assert_raises(Retryd::Rejected) { client.dependency("closed").admit {} }.reason
    scarce = client.dependency("scarce")
    reasons = Array.new(3) do
      scarce.admit(1) { :admitted }
    rescue Retryd::Rejected => e
      e.reason
    end
    assert_equal %i[admitted budget_empty budget_empty], reasons
    assert_equal :first, scarce.admit(0) { :first } # a first attempt needs no token
  end

  def test_half_open_busy
    seg = make_segment(orders: { min_calls: 1, open_for: "1ms", open_jitter: "0ms", probe_timeout: "60s" })
    orders = client_for(seg).dependency("orders")
    orders.admit(&:fail!)
    probe = RetrydTest.wait_for("the breaker to half-open", timeout: 60, interval: 0.005) do
      orders.admit
    rescue Retryd::Rejected
      nil
    end
    assert probe.probe?
    assert_equal :half_open_busy, assert_raises(Retryd::Rejected) { orders.admit }.reason
    probe.complete
  end

  def test_no_segment_falls_back_with_one_log_line_or_fails
    name = "retryd-rbtest-absent-#{Process.pid}-#{rand(1 << 30)}"
    lines = []
    logger = Object.new
    %i[info warn error].each { |m| logger.define_singleton_method(m) { |line| lines << [m, line] } }
    Retryd.logger = logger
    begin
      Retryd::Client.open(segment: name) do |client|
        assert client.local?
        3.times { client.dependency("orders").admit { nil } }
      end
    ensure
      Retryd.logger = nil
    end
    assert_equal 1, lines.size, lines.inspect
    assert_includes lines.first[1], name
    e = assert_raises(Retryd::ClientError) { Retryd::Client.new(segment: name, fallback_to_local: false) }
    assert_equal Retryd::Native::ENOENT, e.code
    assert_includes e.message, name
  end

  def test_segment_from_the_environment
    seg = make_segment(orders: {})
    old = ENV["RETRYD_SEGMENT"]
    ENV["RETRYD_SEGMENT"] = seg.name
    begin
      Retryd::Client.open(fallback_to_local: false) { |c| refute c.local? }
    ensure
      ENV["RETRYD_SEGMENT"] = old
    end
  end

  def test_a_segment_this_user_may_not_map_is_an_error_not_a_fallback
    skip "needs root to drop to another user" unless Process.uid.zero?
    seg = make_segment(orders: {}) # mode 0600, owned by root
    Retryd::Native.load! # before dropping to a user that may not read the build tree
    pid = fork do
      Process::Sys.setgid(65_534)
      Process::Sys.setuid(65_534)
      code = begin
        Retryd::Client.new(segment: seg.name) # the fallback must not hide a refusal
        1
      rescue Retryd::PermissionError => e
        e.code == Retryd::Native::EPERM ? 0 : 2
      rescue Exception
        3
      end
      exit!(code)
    end
    _, status = Process.wait2(pid)
    assert_equal 0, status.exitstatus
  end

  def test_bad_name_and_closed_client
    seg = make_segment
    client = client_for(seg)
    assert_raises(Retryd::ClientError) { client.dependency("no spaces allowed") }
    dep = client.dependency("fine")
    client.close
    client.close
    assert_raises(Retryd::Error) { dep.admit {} }
  end

  def test_library_path_is_reported
    assert_match(/retryd/, Retryd.library_path)
  end
end
