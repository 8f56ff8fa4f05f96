# frozen_string_literal: true

require "net/http"
require "retryd"
require "retryd/adapter"

module Retryd
  # Net::HTTP through a dependency's retry loop.
  #
  #   require "retryd/net_http"
  #   http = Net::HTTP.new("orders.internal", 80)
  #   res = Retryd::NetHTTP.request(orders, http, Net::HTTP::Get.new("/orders/42"),
  #                                 deadline: 2.0, attempt_timeout: 0.8)
  #
  # Each attempt gets the attempt's timeout as open/read/write timeout and the remaining budget
  # as the grpc-timeout header; the request's method and an Idempotency-Key header tell the
  # classification whether it is safe to repeat. Net::HTTP's own repetition of an idempotent
  # request is turned off (max_retries 0): the loop decides, within the host's budget.
  # Returns the last attempt's response: the successful one, or, when the loop gives up or the
  # host refuses a retry (the retry budget spent), the last one (a 4xx, the last 503), as
  # Net::HTTP returns it. When the last attempt raised (a timeout, a refused connection), its
  # exception is raised again, as Net::HTTP raised it. Either carries the CallResult as
  # `retryd_result` (stop, attempts, rejection). Only when the host refuses the first attempt
  # (breaker open, half-open probe busy, bulkhead full) is Retryd::Rejected raised: nothing
  # was sent, serve a fallback.
  module NetHTTP
    IDEMPOTENCY_HEADER = "Idempotency-Key"

    module_function

    # A block (Net::HTTP's way to stream a body as it arrives) is refused: an attempt that is
    # retried would have streamed its body into it already.
    def request(dependency, http, req, policy = nil, env: nil, **overrides)
      if block_given?
        raise ArgumentError, "Retryd::NetHTTP.request takes no block: an attempt that is " \
                             "retried would have streamed its body into it; read the " \
                             "returned response's body instead"
      end
      overrides = { method: req.method, idempotency_key: !req[IDEMPOTENCY_HEADER].nil? }.merge(overrides)
      http.max_retries = 0 if http.respond_to?(:max_retries=)
      Adapter.run(dependency, policy, env, overrides) do |attempt|
        if attempt.timeout
          http.open_timeout = attempt.timeout
          http.read_timeout = attempt.timeout
          http.write_timeout = attempt.timeout if http.respond_to?(:write_timeout=)
          req["grpc-timeout"] = attempt.deadline_header
        end
        http.request(req)
      end
    end
  end
end
