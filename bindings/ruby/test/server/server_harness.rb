# frozen_string_literal: true

# The server tests' harness: the real retryd on a private socket or segment in a temp dir,
# a real pre-forking server (Puma clustered, Unicorn) with the app in app/config.ru preloaded,
# HTTP requests to it, and retryctl's JSON to check the host-wide state.
require_relative "../test_helper"
require "net/http"
require "fileutils"

module ServerHarness
  WORKERS = 3
  APP = File.expand_path("app/config.ru", __dir__)

  def setup
    super
    @dir = Dir.mktmpdir("retryd-rbserver-")
    @state = File.join(@dir, "state")
    FileUtils.mkdir_p(@state)
    @procs = []
    @daemon_bin = RetrydTest.daemon_binary
    @retryctl_bin = RetrydTest.retryctl_binary
    skip "retryd not built" unless @daemon_bin && @retryctl_bin
  end

  def teardown
    @procs.reverse_each do |pid, sig|
      begin
        Process.kill(sig, pid)
        waited = RetrydTest.wait_for("pid #{pid} to exit", timeout: 30) { Process.waitpid(pid, Process::WNOHANG) }
      rescue Errno::ESRCH, Errno::ECHILD
        next
      rescue Minitest::Assertion
        Process.kill(:KILL, pid) rescue nil
        Process.waitpid(pid) rescue nil
      end
      waited
    end
    if failures.any? || ENV["RETRYD_TEST_KEEP_LOGS"]
      Dir.glob(File.join(@dir, "*.log")).each { |f| warn "== #{f}\n#{File.read(f)[-6000..] || File.read(f)}" }
    end
    # A daemon stopped by name leaves its segment for the next one: this test has none.
    File.unlink("/dev/shm/#{@segment}") if @segment && File.exist?("/dev/shm/#{@segment}")
    FileUtils.rm_rf(@dir)
    super
  end

  # Starts retryd with a config of its own: through a socket in the temp dir (`socket: true`)
  # or a segment by name; with the dependencies the tests use.
  def start_daemon(socket:)
    @segment = "retryd-rbserver-#{Process.pid}-#{object_id}"
    @socket = socket ? File.join(@dir, "retryd.sock") : nil
    config = File.join(@dir, "retryd.toml")
    File.write(config, <<~TOML)
      [daemon]
      segment = "#{@segment}"
      socket = "#{@socket}"
      mode = "0600"

      [dependency.orders]
      min_calls = #{WORKERS * 3}
      failure_rate_threshold = 50
      window = "1h"
      open_for = "1h"
      open_for_max = "1h"

      [dependency.scarce]
      retry_burst = 2
      retry_ratio = 0
      min_retries_per_sec = 0

      [dependency.slow]
      bulkhead_limit = 4
      bulkhead_timeout = "1h"
    TOML
    log = File.join(@dir, "retryd.log")
    pid = Process.spawn(@daemon_bin, "--config=#{config}", out: log, err: log)
    @procs << [pid, :TERM]
    RetrydTest.wait_for("retryd to be ready", timeout: 60) do
      raise "retryd exited: #{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)

      File.read(log).include?("daemon: ready")
    end
    pid
  end

  # The server's executable: $RETRYD_TEST_<NAME> (ctest sets none), else the first on $PATH.
  def executable(name)
    env = ENV["RETRYD_TEST_#{name.upcase}"]
    return env if env && !env.empty?

    found = ENV.fetch("PATH", "").split(":").map { |d| File.join(d, name) }.find { |f| File.executable?(f) }
    skip "#{name} not installed (Debian package #{name})" unless found
    found
  end

  def app_env
    env = { "RUBYLIB" => [File.expand_path("../../lib", __dir__), ENV["RUBYLIB"]].compact.join(":"),
            "RETRYD_TEST_STATE" => @state }
    if @socket
      env["RETRYD_TEST_SOCKET"] = @socket
    else
      env["RETRYD_TEST_SEGMENT_NAME"] = @segment
    end
    env
  end

  # Spawns the server (argv), records it for teardown, and waits until it answers /pid.
  def start_server(argv, log_name)
    @port ||= RetrydTest.free_port
    log = File.join(@dir, "#{log_name}.log")
    pid = Process.spawn(app_env, *argv, chdir: @dir, out: log, err: log, pgroup: true)
    @procs << [pid, :TERM]
    RetrydTest.wait_for("#{log_name} to answer on port #{@port}", timeout: 90, interval: 0.2) do
      raise "#{log_name} exited: #{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)

      begin
        get("/pid", timeout: 5)[0] == 200
      rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
        false
      end
    end
    pid
  end

  # GET path; returns [status, parsed JSON body].
  def get(path, timeout: 120)
    http = Net::HTTP.new("127.0.0.1", @port)
    http.open_timeout = timeout
    http.read_timeout = timeout
    # Net::HTTP repeats an idempotent request once when the connection drops: a request whose
    # worker the test kills must not reach a second worker.
    http.max_retries = 0
    res = http.request(Net::HTTP::Get.new(path))
    [res.code.to_i, JSON.parse(res.body)]
  end

  # `n` concurrent requests to path in round `round`, each let through once n workers hold one.
  def round(path, name, n = WORKERS)
    threads = Array.new(n) { Thread.new { get("#{path}?round=#{name}&n=#{n}") } }
    threads.map(&:value)
  end

  def retryctl(*args)
    target = @socket ? "--socket=#{@socket}" : "--segment=#{@segment}"
    out, err, status = Open3.capture3(@retryctl_bin, target, *args)
    raise "retryctl #{args.join(' ')} failed (#{status.exitstatus}): #{err}" unless out.start_with?("{")

    JSON.parse(out.lines.first)
  end

  def dep_status(name)
    retryctl("status", "--json", name)["dependencies"].find { |d| d["name"] == name }
  end

  def worker_entries
    retryctl("workers", "--json")["workers"]
  end

  # The test both servers pass: the preloaded app's workers share one breaker, one retry budget
  # and the bulkhead; each is a process of its own; a worker killed mid-call gives its lease back.
  def check_shared_limits(master_pid)
    # 3 rounds of WORKERS concurrent failures, each round served by all the workers: the breaker
    # opens once min_calls (3 x WORKERS) failures have been counted, from all of them together.
    pids = []
    3.times do |r|
      replies = round("/fail", "fail#{r}")
      assert_equal [502] * WORKERS, replies.map(&:first), replies.inspect
      round_pids = replies.map { |_, body| body["pid"] }
      assert_equal WORKERS, round_pids.uniq.size, "round #{r} served by #{round_pids.inspect}"
      replies.each { |_, body| assert_equal master_pid, body["ppid"], "workers are forked by the master" }
      pids.concat(round_pids)
    end
    worker_pids = pids.uniq.sort
    assert_equal WORKERS, worker_pids.size
    refute_includes worker_pids, master_pid

    # Every worker now sees the one breaker open.
    refused = round("/fail", "refused")
    assert_equal [503] * WORKERS, refused.map(&:first), refused.inspect
    assert_equal ["rejected open"] * WORKERS, refused.map { |_, b| b["outcome"] }
    assert_equal worker_pids, refused.map { |_, b| b["pid"] }.sort

    orders = dep_status("orders")
    assert_equal "open", orders["breaker"]["state"]
    assert orders["open"]
    assert_equal 1, orders["counters"]["opened"], "one breaker, opened once"
    assert_equal 3 * WORKERS, orders["counters"]["failures"], "the failures of every worker, summed"
    assert_equal 3 * WORKERS, orders["counters"]["first_attempts"]
    assert_equal WORKERS, orders["counters"]["rejected_open"]
    assert_equal 0, orders["counters"]["successes"]

    # One retry budget of 2 tokens for the host: of WORKERS concurrent retries, in WORKERS
    # processes, 2 are granted.
    retries = round("/retry", "retry")
    outcomes = retries.map { |_, b| b["outcome"] }.sort
    assert_equal ["granted"] * 2 + ["rejected budget_empty"] * (WORKERS - 2), outcomes
    assert_equal worker_pids, retries.map { |_, b| b["pid"] }.sort
    scarce = dep_status("scarce")
    assert_equal 2, scarce["retries"]["granted"]
    assert_equal WORKERS - 2, scarce["retries"]["denied"]

    # Each worker is a process of its own in the registry, beside the master.
    listed = worker_entries.select { |w| w["state"] == "live" }.map { |w| w["pid"] }
    worker_pids.each { |pid| assert_includes listed, pid, "worker #{pid} registered on its own" }
    assert_equal listed.uniq.size, listed.size

    # A worker killed with SIGKILL while it holds a bulkhead lease gives it back.
    slow = Thread.new do
      get("/slow")
    rescue StandardError => e
      e
    end
    holder = RetrydTest.wait_for("a worker to hold the slow lease", timeout: 60) do
      Dir.glob(File.join(@state, "holding-*")).first
    end
    holder_pid = Integer(File.basename(holder).split("-").last)
    assert_includes worker_pids, holder_pid
    assert_equal 1, dep_status("slow")["bulkhead"]["in_use"]
    Process.kill(:KILL, holder_pid)
    begin
      RetrydTest.wait_for("the killed worker's lease to be reclaimed", timeout: 60) do
        dep_status("slow")["bulkhead"]["in_use"].zero?
      end
    rescue Minitest::Assertion => e
      raise e.class, "#{e.message}; slow: #{dep_status('slow').inspect}; workers: #{worker_entries.inspect}"
    end
    refute_nil slow.join(60), "the slow request ends with its worker"
    RetrydTest.wait_for("the killed worker to leave the registry", timeout: 60) do
      worker_entries.none? { |w| w["pid"] == holder_pid && w["state"] == "live" }
    end
    # The master forks a replacement; the lease is free for every worker again.
    assert_equal 200, get("/quick")[0]
    assert_equal 0, dep_status("slow")["bulkhead"]["in_use"]
  end
end
