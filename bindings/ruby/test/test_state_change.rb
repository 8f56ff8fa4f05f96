# frozen_string_literal: true

# Breaker state-change subscriptions: Dependency#subscribe and Client#subscribe.
require_relative "test_helper"
require "logger"
require "stringio"

class StateChangeTest < Minitest::Test
  include RetrydTest::Segments

  class Down < StandardError; end

  # Trips on the second failure; open for 400 ms with no jitter (long enough for the rejections
  # a test makes right after the trip on a loaded machine); one probe success closes.
  QUICK = { min_calls: 2, open_for: "400ms", open_for_max: "400ms", open_jitter: "0ms",
            close_after: 1 }.freeze
  # Trips as QUICK does, then stays open for the whole test however slow the machine.
  STAYS_OPEN = QUICK.merge(open_for: "1h", open_for_max: "1h").freeze

  def client_for(seg)
    Retryd::Client.new(segment: seg.name, fallback_to_local: false)
  end

  def fail_calls(dep, times)
    times.times { assert_raises(Down) { dep.admit { raise Down, "down" } } }
  end

  # Counts the calls of Native.retryd_breaker_state for the block.
  def count_state_reads
    count = [0]
    native = Retryd::Native.singleton_class
    native.alias_method :__uncounted_breaker_state, :retryd_breaker_state
    native.define_method(:retryd_breaker_state) do |*args|
      count[0] += 1
      __uncounted_breaker_state(*args)
    end
    yield count
  ensure
    native.alias_method :retryd_breaker_state, :__uncounted_breaker_state
    native.remove_method :__uncounted_breaker_state
  end

  def test_subscriber_sees_open_half_open_and_closed
    seg = make_segment(orders: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    assert_equal :closed, orders.state
    seen = []
    sub = orders.subscribe { |name, old, new| seen << [name, old, new] }
    assert_kind_of Retryd::Subscription, sub
    fail_calls(orders, 2)
    assert_equal "open", seg.state("orders")
    assert_equal [["orders", :closed, :open]], seen
    3.times { assert_raises(Retryd::Rejected) { orders.admit { flunk "must not run" } } }
    assert_equal [["orders", :closed, :open]], seen # rejections change nothing
    sleep 0.45
    orders.admit do |permit| # the probe: the admission made the breaker half-open
      assert permit.probe?
      assert_equal ["orders", :open, :half_open], seen.last
    end
    assert_equal [["orders", :closed, :open], ["orders", :open, :half_open],
                  ["orders", :half_open, :closed]], seen
    assert_equal :closed, orders.state
    client.close
  end

  def test_call_reports_transitions
    seg = make_segment(orders: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    seen = []
    orders.subscribe { |_name, old, new| seen << [old, new] }
    2.times do
      assert_raises(Errno::ECONNREFUSED, Retryd::CallFailed, Retryd::Rejected) do
        orders.call(max_attempts: 1) { raise Errno::ECONNREFUSED }
      end
    end
    assert_equal [%i[closed open]], seen
    sleep 0.45
    assert_equal :ok, orders.call(max_attempts: 1) { :ok }
    assert_equal [%i[closed open], %i[open half_open], %i[half_open closed]], seen
    client.close
  end

  def test_client_subscription_covers_every_dependency
    seg = make_segment(orders: QUICK, users: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    seen = []
    sub = client.subscribe { |name, old, new| seen << [name, old, new] }
    users = client.dependency("users") # resolved after subscribing
    fail_calls(orders, 2)
    fail_calls(users, 2)
    assert_equal [["orders", :closed, :open], ["users", :closed, :open]], seen
    sub.unsubscribe
    sub.unsubscribe # a no-op
    refute sub.active?
    refute orders.watched
    refute users.watched
    client.close
  end

  def test_a_subscriber_that_raises_is_logged_and_the_call_goes_on
    seg = make_segment(orders: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    seen = []
    orders.subscribe { raise ArgumentError, "subscriber bug" }
    orders.subscribe { |_name, old, new| seen << [old, new] }
    out = StringIO.new
    Retryd.logger = Logger.new(out)
    begin
      fail_calls(orders, 2) # the block's own Down, not the subscriber's error
    ensure
      Retryd.logger = nil
    end
    assert_equal [%i[closed open]], seen
    assert_match(/state-change subscriber of orders raised ArgumentError: subscriber bug/, out.string)
    client.close
  end

  def test_no_subscriber_no_state_read
    seg = make_segment(orders: STAYS_OPEN, users: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    users = client.dependency("users")
    count_state_reads do |reads|
      fail_calls(orders, 2)
      assert_raises(Retryd::Rejected) { orders.admit { flunk "must not run" } }
      assert_equal :ok, users.call(max_attempts: 1) { :ok }
      assert_equal 0, reads[0] # never subscribed: admit, complete and call never read it

      seen = []
      sub = users.subscribe { |_name, old, new| seen << [old, new] }
      assert_equal 1, reads[0] # the state to compare with, read at subscription
      assert_raises(Retryd::Rejected) { orders.admit { flunk "must not run" } }
      assert_equal 1, reads[0] # another dependency: still no read
      users.admit { nil }
      assert_equal 3, reads[0] # after the admission and the completion
      sub.unsubscribe
      users.admit { nil }
      assert_equal :ok, users.call(max_attempts: 1) { :ok }
      assert_equal 3, reads[0] # unsubscribed: no read again
      assert_empty seen
    end
    client.close
  end

  def test_a_subscriber_unsubscribed_by_another_is_not_called_for_the_same_change
    seg = make_segment(orders: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    seen = []
    second = nil
    orders.subscribe do |_name, old, new|
      seen << [:first, old, new]
      second.unsubscribe
    end
    second = orders.subscribe { |_name, old, new| seen << [:second, old, new] }
    fail_calls(orders, 2)
    assert_equal [[:first, :closed, :open]], seen
    client.close
  end

  # Not a StandardError: what an Interrupt raised in a subscriber looks like.
  class Stop < Exception; end # rubocop:disable Lint/InheritException

  def test_a_subscriber_raising_past_standard_error_gives_the_admission_back
    seg = make_segment(orders: QUICK)
    client = client_for(seg)
    orders = client.dependency("orders")
    sub = orders.subscribe { |_name, _old, new| raise Stop if new == :half_open }
    fail_calls(orders, 2)
    sleep 0.45
    assert_raises(Stop) { orders.admit { flunk "must not run" } } # the probe, then the raise
    sub.unsubscribe
    # The probe's lease came back: the breaker takes the next probe at once and closes.
    orders.admit { |permit| assert permit.probe? }
    assert_equal :closed, orders.state
    client.close
  end
end
