# frozen_string_literal: true

# Shared by the suites: real named segments made by the retryd_test_segment helper, the real
# daemon and retryctl, and waits that poll a condition.
#
# Binaries come from $RETRYD_TEST_SEGMENT, $RETRYD_DAEMON and $RETRYD_RETRYCTL (set by
# ctest), else from the source tree's build directories; the library from $RETRYD_LIBRARY,
# else as the gem finds it.
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "minitest/autorun"
require "json"
require "open3"
require "socket"
require "tmpdir"
require "fileutils"
require "retryd"

module RetrydTest
  ROOT = File.expand_path("../../..", __dir__)

  module_function

  def binary(env, pattern)
    path = ENV[env]
    return path if path && !path.empty?

    Dir.glob(File.join(ROOT, pattern)).min
  end

  def test_segment_binary
    binary("RETRYD_TEST_SEGMENT", "build*/tests/client/retryd_test_segment")
  end

  def daemon_binary
    binary("RETRYD_DAEMON", "build*/daemon/retryd")
  end

  def retryctl_binary
    binary("RETRYD_RETRYCTL", "build*/cli/retryctl")
  end

  # Polls the block every `interval` seconds until it returns a truthy value, and returns it;
  # fails the test with `what` (and the block's last value) after `timeout` seconds.
  def wait_for(what, timeout: 60, interval: 0.05)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    last = nil
    loop do
      last = yield
      return last if last

      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        raise Minitest::Assertion, "timed out after #{timeout}s waiting for #{what} (last: #{last.inspect})"
      end

      sleep interval
    end
  end

  # A free TCP port on 127.0.0.1, picked by binding to port 0.
  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  # A named segment held by a retryd_test_segment process; removed by #close.
  class Segment
    @ids = 0
    class << self
      attr_accessor :ids
    end

    attr_reader :name

    # deps: { "orders" => { min_calls: 2, open_for: "60s" } } (config keys, TOML values).
    def initialize(helper, deps)
      Segment.ids += 1
      @name = "retryd-rbtest-#{Process.pid}-#{Segment.ids}"
      specs = deps.map do |dep, settings|
        pairs = settings.map { |k, v| "#{k}=#{JSON.generate(v)}" }.join(",")
        pairs.empty? ? dep.to_s : "#{dep}:#{pairs}"
      end
      @stdin, @stdout, @thread = Open3.popen2(helper, @name, *specs)
      line = @stdout.gets.to_s.strip
      raise "retryd_test_segment did not start: #{line.inspect}" unless line == "READY"
    end

    def ask(line)
      @stdin.puts(line)
      @stdin.flush
      @stdout.gets.to_s.strip
    end

    # The breaker state: "closed", "open" or "half-open".
    def state(dep)
      ask("state #{dep}")
    end

    def reset(dep)
      ask("reset #{dep}")
    end

    def close
      return if @stdin.closed?

      @stdin.close
      @thread.join(10)
    end
  end

  # Minitest mix-in: make_segment(orders: {...}) gives a Segment closed after the test.
  module Segments
    def make_segment(**deps)
      helper = RetrydTest.test_segment_binary
      skip "retryd_test_segment not built" unless helper
      seg = Segment.new(helper, deps)
      (@segments ||= []) << seg
      seg
    end

    def teardown
      (@segments || []).each(&:close)
      super
    end
  end
end
