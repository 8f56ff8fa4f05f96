# frozen_string_literal: true

# The Net::HTTP helper and the Faraday middleware against a scripted HTTP server on a port
# picked by binding to port 0.
require_relative "test_helper"
require "retryd/net_http"
require "retryd/faraday"

class AdaptersTest < Minitest::Test
  include RetrydTest::Segments

  # Answers each connection with the next scripted [status, headers] (the last one repeats),
  # and records each request's head and body.
  class ScriptedServer
    attr_reader :requests, :port

    def initialize(script)
      @script = script
      @requests = Queue.new
      @server = TCPServer.new("127.0.0.1", 0)
      @port = @server.addr[1]
      @n = 0
      @thread = Thread.new { serve }
    end

    def serve
      loop do
        conn = @server.accept
        head = +""
        while (line = conn.gets) && line != "\r\n"
          head << line
        end
        length = head[/content-length: *(\d+)/i, 1].to_i
        body = length.positive? ? conn.read(length) : ""
        @requests << [head, body]
        status, headers = @script[[@n, @script.size - 1].min]
        @n += 1
        extra = headers.map { |k, v| "#{k}: #{v}\r\n" }.join
        conn.write("HTTP/1.1 #{status} X\r\n#{extra}content-length: 2\r\nconnection: close\r\n\r\nok")
        conn.close
      end
    rescue IOError
      nil
    end

    def close
      @server.close
      @thread.join(10)
    end
  end

  def setup
    super
    seg = make_segment(orders: { min_calls: 1000 })
    @dep = Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("orders")
    @env = Retryd::Env.new(sleep: ->(_) {}) # no real waits between attempts
  end

  def serve(script)
    @server = ScriptedServer.new(script)
  end

  def teardown
    @server&.close
    super
  end

  def test_net_http_retries_a_503_and_passes_the_deadline_downstream
    serve([[503, { "Retry-After" => "0" }], [200, {}]])
    http = Net::HTTP.new("127.0.0.1", @server.port)
    res = Retryd::NetHTTP.request(@dep, http, Net::HTTP::Get.new("/x"), deadline: 30.0, env: @env)
    assert_equal "200", res.code
    assert_equal 2, @server.requests.size
    head, = @server.requests.pop
    assert_match(/^grpc-timeout: \d+[HMSmun]\r$/i, head)
  end

  def test_net_http_post_without_idempotency_key_is_not_retried_on_a_timeout_but_4xx_is_terminal
    serve([[404, {}]])
    http = Net::HTTP.new("127.0.0.1", @server.port)
    post = Net::HTTP::Post.new("/orders")
    post.body = "{}"
    res = Retryd::NetHTTP.request(@dep, http, post, env: @env)
    assert_equal "404", res.code
    assert_equal :terminal, res.retryd_result.stop
    assert_equal 1, @server.requests.size
  end

  def test_net_http_refuses_a_block_and_sends_nothing
    serve([[200, {}]])
    http = Net::HTTP.new("127.0.0.1", @server.port)
    e = assert_raises(ArgumentError) do
      Retryd::NetHTTP.request(@dep, http, Net::HTTP::Get.new("/x"), env: @env) { |_res| nil }
    end
    assert_match(/takes no block/, e.message)
    assert_equal 0, @server.requests.size
  end

  def test_net_http_refused_connection_is_retried_then_gives_up
    port = RetrydTest.free_port # nothing listens there
    http = Net::HTTP.new("127.0.0.1", port)
    # The last attempt's exception, as Net::HTTP raised it.
    e = assert_raises(Errno::ECONNREFUSED) do
      Retryd::NetHTTP.request(@dep, http, Net::HTTP::Post.new("/orders"), max_attempts: 3, env: @env)
    end
    assert_equal :attempts_exhausted, e.retryd_result.stop
    assert_equal :connect_refused, e.retryd_result.last_error
    assert_equal 3, e.retryd_result.attempts
  end

  def test_faraday_middleware_retries_and_resends_the_body
    serve([[502, {}], [201, {}]])
    conn = Faraday.new(url: "http://127.0.0.1:#{@server.port}") do |f|
      f.request :retryd, dependency: @dep, env: @env, deadline: 30.0
      f.adapter :net_http
    end
    res = conn.post("/orders", "payload", "Idempotency-Key" => "k1")
    assert_equal 201, res.status
    bodies = Array.new(2) { @server.requests.pop[1] }
    assert_equal %w[payload payload], bodies
  end

  def test_faraday_rejection_and_connection_failure
    port = RetrydTest.free_port
    conn = Faraday.new(url: "http://127.0.0.1:#{port}") do |f|
      f.use Retryd::FaradayMiddleware, dependency: @dep, env: @env, max_attempts: 2
      f.adapter :net_http
    end
    e = assert_raises(Faraday::ConnectionFailed) { conn.get("/") }
    assert_equal :connect_refused, e.retryd_result.last_error
    assert_equal 2, e.retryd_result.attempts
  end

  def test_faraday_returns_the_last_5xx_when_attempts_run_out
    serve([[503, {}]])
    conn = Faraday.new(url: "http://127.0.0.1:#{@server.port}") do |f|
      f.request :retryd, dependency: @dep, env: @env, max_attempts: 2
      f.adapter :net_http
    end
    res = conn.get("/")
    assert_equal 503, res.status
    assert_equal :attempts_exhausted, res.retryd_result.stop
    assert_equal 2, @server.requests.size
  end

  def test_refused_first_attempt_raises_rejected_and_sends_nothing
    serve([[200, {}]])
    seg = make_segment(orders: { mode: "forced-open" })
    dep = Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("orders")
    http = Net::HTTP.new("127.0.0.1", @server.port)
    e = assert_raises(Retryd::Rejected) { Retryd::NetHTTP.request(dep, http, Net::HTTP::Get.new("/"), env: @env) }
    assert_equal :open, e.reason
    conn = Faraday.new(url: "http://127.0.0.1:#{@server.port}") do |f|
      f.request :retryd, dependency: dep, env: @env
      f.adapter :net_http
    end
    e = assert_raises(Retryd::Rejected) { conn.get("/") }
    assert_equal :open, e.reason
    assert_equal 0, @server.requests.size
  end

  # A dependency whose retry budget is spent: its one token taken, none deposited or refilled.
  def budget_empty_dependency
    seg = make_segment(scarce: { min_calls: 1000, retry_burst: 1, retry_ratio: 0, min_retries_per_sec: 0 })
    dep = Retryd::Client.new(segment: seg.name, fallback_to_local: false).dependency("scarce")
    dep.admit(1) { nil } # a retry: takes the token
    e = assert_raises(Retryd::Rejected) { dep.admit(1) { nil } }
    assert_equal :budget_empty, e.reason
    dep
  end

  # The same scenario in every binding's adapters: the first attempt gets a 503, the host
  # refuses the retry (budget empty), and the client's call returns that 503.
  def test_retry_refused_by_budget_returns_the_503
    dep = budget_empty_dependency
    serve([[503, {}], [200, {}]])
    http = Net::HTTP.new("127.0.0.1", @server.port)
    res = Retryd::NetHTTP.request(dep, http, Net::HTTP::Get.new("/orders"), deadline: 30.0, env: @env)
    assert_equal "503", res.code
    assert_equal 1, @server.requests.size
    assert_equal [:rejected, :budget_empty, 1],
                 [res.retryd_result.stop, res.retryd_result.rejection, res.retryd_result.attempts]

    @server.close
    serve([[503, {}], [200, {}]])
    conn = Faraday.new(url: "http://127.0.0.1:#{@server.port}") do |f|
      f.request :retryd, dependency: dep, env: @env, deadline: 30.0
      f.adapter :net_http
    end
    res = conn.get("/orders")
    assert_equal 503, res.status
    assert_equal 1, @server.requests.size
    assert_equal [:rejected, :budget_empty, 1],
                 [res.retryd_result.stop, res.retryd_result.rejection, res.retryd_result.attempts]
  end

  # The first attempt's connection is refused, the host refuses the retry: the client's own
  # exception.
  def test_retry_refused_by_budget_raises_the_clients_error
    dep = budget_empty_dependency
    port = RetrydTest.free_port # nothing listens there
    e = assert_raises(Errno::ECONNREFUSED) do
      Retryd::NetHTTP.request(dep, Net::HTTP.new("127.0.0.1", port), Net::HTTP::Get.new("/"), env: @env)
    end
    assert_equal [:rejected, :budget_empty, 1],
                 [e.retryd_result.stop, e.retryd_result.rejection, e.retryd_result.attempts]

    conn = Faraday.new(url: "http://127.0.0.1:#{port}") do |f|
      f.request :retryd, dependency: dep, env: @env
      f.adapter :net_http
    end
    e = assert_raises(Faraday::ConnectionFailed) { conn.get("/") }
    assert_equal [:rejected, :budget_empty, 1],
                 [e.retryd_result.stop, e.retryd_result.rejection, e.retryd_result.attempts]
  end
end
