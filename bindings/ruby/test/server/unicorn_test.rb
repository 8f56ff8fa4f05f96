# frozen_string_literal: true

# Unicorn (several workers, preload_app true) serving the app in app/config.ru, attached to
# retryd's segment by name.
require_relative "server_harness"

class UnicornTest < Minitest::Test
  include ServerHarness

  def test_preloaded_workers_share_one_breaker_one_budget_and_give_back_a_killed_workers_lease
    start_daemon(socket: false)
    @port = RetrydTest.free_port
    config = File.join(@dir, "unicorn.rb")
    File.write(config, <<~RUBY)
      worker_processes #{WORKERS}
      preload_app true
      listen "127.0.0.1:#{@port}"
      timeout 3600
    RUBY
    master = start_server([executable("unicorn"), "-c", config, APP], "unicorn")
    check_shared_limits(master)
  end
end
