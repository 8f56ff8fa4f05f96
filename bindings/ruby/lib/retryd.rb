# frozen_string_literal: true

# retryd: host-wide retry budgets and circuit breakers for Ruby workers.
#
# A binding (ruby-ffi, no compiled extension) of libretryd's C ABI. Each worker process opens a
# Client; every attempt of every call to a downstream dependency is admitted by the host's
# shared segment and reported back to it, so the limits hold for all the workers on the host
# together (Puma's and Unicorn's forked workers included):
#
#   require "retryd"
#
#   client = Retryd::Client.new              # the host's segment, or per-process fallback
#   orders = client.dependency("orders")
#
#   begin
#     orders.admit { |permit| http.get("/orders") }  # success on return, failure on raise
#   rescue Retryd::Rejected => e                      # e.reason: :open, :half_open_busy, ...
#     fallback(e.reason)
#   end
#
#   # The whole retry loop: backoff with jitter, Retry-After, deadline, classification.
#   orders.call(Retryd::Policy.new(deadline: 2.0)) { |attempt| http.get("/orders") }
require "retryd/version"
require "retryd/native"
require "retryd/errors"
require "retryd/policy"
require "retryd/client"
require "retryd/call"
require "retryd/log"

module Retryd
  # The file libretryd was loaded from (loads it on first use).
  def self.library_path
    Native.library_path
  end
end
