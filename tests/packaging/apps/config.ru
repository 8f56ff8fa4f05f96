# frozen_string_literal: true

# The Rack app in_root.sh serves with the packaged gem under a clustered Puma: each request
# admits one call of the dependency clean-root-puma through the daemon, and answers with the
# worker's pid, its parent's (the Puma master) and whether the client is attached to the daemon.
# The client is opened at load time: Puma's --preload opens it in the master, and each worker
# it forks registers with the daemon on its first admission.
require "json"
require "retryd"

CLIENT = Retryd::Client.new(fallback_to_local: false)
DEPENDENCY = CLIENT.dependency("clean-root-puma")

run(lambda do |_env|
  body = DEPENDENCY.admit do
    sleep 0.2 # busy a moment, so that concurrent requests go to every worker
    JSON.generate(pid: Process.pid, ppid: Process.ppid, attached: !CLIENT.local?,
                  library: Retryd.library_path, gem: $LOADED_FEATURES.grep(%r{/retryd\.rb\z}).first)
  end
  [200, { "content-type" => "application/json" }, [body]]
end)
