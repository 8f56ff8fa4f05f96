# frozen_string_literal: true

# Puma in clustered mode (several workers, preload_app!) serving the app in app/config.ru,
# attached to retryd through its socket.
require_relative "server_harness"

class PumaClusterTest < Minitest::Test
  include ServerHarness

  def test_preloaded_workers_share_one_breaker_one_budget_and_give_back_a_killed_workers_lease
    start_daemon(socket: true)
    @port = RetrydTest.free_port
    config = File.join(@dir, "puma.rb")
    File.write(config, <<~RUBY)
      workers #{WORKERS}
      threads 1, 1
      preload_app!
      # One request per worker at a time, accepted only when its thread is free.
      queue_requests false
      bind "tcp://127.0.0.1:#{@port}"
      rackup #{APP.inspect}
      worker_timeout 3600
      worker_boot_timeout 120
    RUBY
    master = start_server([executable("puma"), "-C", config], "puma")
    check_shared_limits(master)
  end
end
