# frozen_string_literal: true

# Forked children keep using their parent's client, and share the limits with it (and every
# other process) through the segment; the same through the daemon's socket.
require_relative "test_helper"

class ForkTest < Minitest::Test
  include RetrydTest::Segments

  # Runs the block in a forked child; returns its exit status (the block's value as the code).
  def in_child
    pid = fork do
      code = begin
        yield
      rescue Exception # the child never returns into minitest
        99
      end
      exit!(code)
    end
    Process.wait2(pid)[1].exitstatus
  end

  def test_a_forked_child_keeps_working_and_shares_the_breaker
    seg = make_segment(orders: { min_calls: 4, open_for: "60s", open_for_max: "60s" })
    client = Retryd::Client.new(segment: seg.name, fallback_to_local: false)
    orders = client.dependency("orders")
    orders.admit { nil } # the parent has registered and used the segment before forking
    assert_equal 0, in_child { 3.times { orders.admit(&:fail!) }; 0 }
    assert_equal "open", seg.state("orders")
    assert_equal :open, assert_raises(Retryd::Rejected) { orders.admit {} }.reason
  end

  def test_a_forked_child_holds_a_host_wide_lease
    seg = make_segment(orders: { bulkhead_limit: 1 })
    orders = Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("orders")
    to_child_r, to_child_w = IO.pipe
    to_parent_r, to_parent_w = IO.pipe
    pid = fork do
      orders.admit do
        to_parent_w.puts "holding"
        to_child_r.gets
      end
      exit!(0)
    end
    assert_equal "holding", to_parent_r.gets.chomp
    assert_equal :bulkhead_full, assert_raises(Retryd::Rejected) { orders.admit {} }.reason
    to_child_w.puts "release"
    assert_equal 0, Process.wait2(pid)[1].exitstatus
    orders.admit { nil }
  end

  def test_many_children_count_into_one_breaker
    seg = make_segment(orders: { min_calls: 6, open_for: "60s", open_for_max: "60s" })
    orders = Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("orders")
    pids = Array.new(3) { fork { 2.times { orders.admit(&:fail!) }; exit!(0) } }
    pids.each { |pid| assert_equal 0, Process.wait2(pid)[1].exitstatus }
    assert_equal "open", seg.state("orders")
  end
end

class SocketTest < Minitest::Test
  def setup
    super
    @bin = RetrydTest.daemon_binary
    skip "retryd not built" unless @bin
    @dir = Dir.mktmpdir("retryd-rbsock-")
    @sock = File.join(@dir, "retryd.sock")
    File.write(File.join(@dir, "retryd.toml"),
               "[daemon]\nsocket = \"#{@sock}\"\n\n[dependency.orders]\nbulkhead_limit = 1\n")
    @log = File.join(@dir, "retryd.log")
    @pid = Process.spawn(@bin, "--config=#{File.join(@dir, 'retryd.toml')}", out: @log, err: @log)
    RetrydTest.wait_for("retryd to be ready", timeout: 60) do
      raise "retryd exited: #{File.read(@log)}" if Process.waitpid(@pid, Process::WNOHANG)

      File.read(@log).include?("daemon: ready")
    end
  end

  def teardown
    if @pid
      Process.kill(:TERM, @pid)
      Process.wait(@pid)
    end
    FileUtils.rm_rf(@dir) if @dir
    super
  end

  def test_attaches_through_the_socket_and_a_forked_child_shares_the_bulkhead
    client = Retryd::Client.new(socket: @sock, fallback_to_local: false)
    refute client.local?
    orders = client.dependency("orders")
    orders.admit { nil }
    r, w = IO.pipe
    back_r, back_w = IO.pipe
    pid = fork do
      orders.admit do
        w.puts "holding"
        back_r.gets
      end
      exit!(0)
    end
    assert_equal "holding", r.gets.chomp
    assert_equal :bulkhead_full, assert_raises(Retryd::Rejected) { orders.admit {} }.reason
    back_w.puts "done"
    assert_equal 0, Process.wait2(pid)[1].exitstatus
    orders.admit { nil }
    client.close
  end

  def test_a_stopped_daemon_neither_fails_nor_delays_a_new_client
    Process.kill(:STOP, @pid)
    begin
      start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      client = Retryd::Client.new(socket: @sock)
      opened = Process.clock_gettime(Process::CLOCK_MONOTONIC) - start
      assert_operator opened, :<, 0.2, "the client waited #{opened} s for the stopped daemon"
      assert client.local?
      orders = client.dependency("orders")
      slowest = 20.times.map do
        t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        orders.admit { nil }
        Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
      end.max
      assert_operator slowest, :<, 0.2, "an admit waited #{slowest} s for the stopped daemon"
    ensure
      Process.kill(:CONT, @pid)
    end
    # Resumed, the daemon answers the hello the client sent; a later call moves it over.
    RetrydTest.wait_for("the client to attach after the daemon resumed", timeout: 60, interval: 0.002) do
      orders.admit { nil }
      !client.local?
    end
    client.close
  end

  def test_no_daemon_at_the_socket_is_an_error_that_names_it
    missing = File.join(@dir, "none.sock")
    e = assert_raises(Retryd::ClientError) { Retryd::Client.new(socket: missing, fallback_to_local: false) }
    assert_includes e.message, missing
    Retryd::Client.open(socket: missing) { |c| assert c.local? }
  end
end
