# frozen_string_literal: true

# The Rack app the server tests run in Puma and Unicorn: every route admits through one
# dependency of the daemon named by $RETRYD_TEST_SOCKET or $RETRYD_TEST_SEGMENT. The client is
# opened here, at load time, so with preload the master opens it and every worker inherits it
# across fork.
require "json"
require "retryd"

opts = if ENV["RETRYD_TEST_SOCKET"]
         { socket: ENV.fetch("RETRYD_TEST_SOCKET") }
       else
         { segment: ENV.fetch("RETRYD_TEST_SEGMENT_NAME") }
       end
CLIENT = Retryd::Client.new(**opts, fallback_to_local: false)
ORDERS = CLIENT.dependency("orders")
SCARCE = CLIENT.dependency("scarce")
SLOW = CLIENT.dependency("slow")
STATE_DIR = ENV.fetch("RETRYD_TEST_STATE")

# What the downstream raises: the call failed.
class DownstreamDown < StandardError; end

# Holds each request of a round until `n` different processes hold one, so that a round of n
# concurrent requests is served by n different workers (each serves one request at a time).
def gate(round, n)
  File.write(File.join(STATE_DIR, "gate-#{round}-#{Process.pid}"), "")
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 90
  until Dir.glob(File.join(STATE_DIR, "gate-#{round}-*")).size >= n
    return false if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

    sleep 0.01
  end
  true
end

def reply(status, outcome)
  [status, { "content-type" => "application/json" },
   [JSON.generate(pid: Process.pid, ppid: Process.ppid, outcome: outcome)]]
end

APP = lambda do |env|
  params = Rack::Utils.parse_query(env["QUERY_STRING"])
  round = params["round"]
  n = Integer(params["n"] || 1)
  return reply(500, "gate timed out") if round && !gate(round, n)

  case env["PATH_INFO"]
  when "/pid"
    reply(200, "pid")
  when "/fail"
    begin
      ORDERS.admit { raise DownstreamDown, "downstream down" }
    rescue DownstreamDown
      reply(502, "failed")
    rescue Retryd::Rejected => e
      reply(503, "rejected #{e.reason}")
    end
  when "/retry"
    begin
      SCARCE.admit(1) { reply(200, "granted") }
    rescue Retryd::Rejected => e
      reply(503, "rejected #{e.reason}")
    end
  when "/slow"
    SLOW.admit do
      File.write(File.join(STATE_DIR, "holding-#{Process.pid}"), "")
      sleep 3600 # killed with SIGKILL by the test while it holds the bulkhead lease
      reply(200, "slept")
    end
  when "/quick"
    SLOW.admit { reply(200, "quick") }
  else
    reply(404, "no route")
  end
end

run APP
