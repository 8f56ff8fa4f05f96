# frozen_string_literal: true

RETRYD_GEMSPEC_DIR = File.expand_path(__dir__) unless defined?(RETRYD_GEMSPEC_DIR)
require File.join(RETRYD_GEMSPEC_DIR, "lib/retryd/version")

# `gem build bindings/ruby/retryd.gemspec` (rubygems 3.3, Debian 12) packs the files relative
# to the working directory: build from this one, so the gem is the same from anywhere (the
# .gem is written here, or where --output says).
if File.basename($PROGRAM_NAME) == "gem" && ARGV.first == "build" && Dir.pwd != RETRYD_GEMSPEC_DIR
  Dir.chdir(RETRYD_GEMSPEC_DIR)
end

Gem::Specification.new do |s|
  s.name = "retryd"
  s.version = Retryd::VERSION
  s.summary = "Host-wide retry budgets and circuit breakers (binding of libretryd)"
  s.description = "A ruby-ffi binding of libretryd's C ABI: circuit breakers, retry budgets, " \
                  "bulkheads and half-open probes shared by every worker process on a host " \
                  "through retryd's shared-memory segment, and the library's retry loop."
  s.authors = ["retryd authors"]
  s.license = "Apache-2.0"
  s.required_ruby_version = ">= 3.0"
  s.files = Dir.chdir(RETRYD_GEMSPEC_DIR) { Dir["lib/**/*.rb", "README.md", "bench/*.rb"] }
  s.require_paths = ["lib"]
  s.add_runtime_dependency "ffi", "~> 1.15"
  s.metadata = { "rubygems_mfa_required" => "true" }
end
