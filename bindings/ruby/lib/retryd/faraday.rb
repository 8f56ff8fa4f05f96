# frozen_string_literal: true

require "faraday"
require "retryd"
require "retryd/adapter"

module Retryd
  # A Faraday (1.x) middleware that sends each request through a dependency's retry loop.
  #
  #   require "retryd/faraday"
  #   conn = Faraday.new(url: "http://orders.internal") do |f|
  #     f.request :retryd, dependency: orders, policy: Retryd::Policy.new(deadline: 2.0)
  #     f.adapter :net_http
  #   end
  #
  # Put it before (outside) any middleware that raises on a status (raise_error) and do not
  # combine it with Faraday's own retry middleware. Each attempt gets the attempt's timeout as
  # the request timeout and the remaining budget as the grpc-timeout header; the method and an
  # Idempotency-Key header tell the classification whether the call is safe to repeat.
  # Returns the last attempt's response: the successful one, or, when the loop gives up or the
  # host refuses a retry (the retry budget spent), the last one (a 4xx, the last 503), as
  # Faraday returns it. When the last attempt raised (Faraday::TimeoutError,
  # Faraday::ConnectionFailed), its exception is raised again, as Faraday raised it. Either
  # carries the CallResult as `retryd_result` (stop, attempts, rejection). Only when the host
  # refuses the first attempt (breaker open, half-open probe busy, bulkhead full) is
  # Retryd::Rejected raised: nothing was sent, serve a fallback.
  class FaradayMiddleware < ::Faraday::Middleware
    IDEMPOTENCY_HEADER = "Idempotency-Key"

    def initialize(app, dependency:, policy: nil, env: nil, **overrides)
      super(app)
      @dependency = dependency
      @policy = policy
      @env = env
      @overrides = overrides
    end

    def call(request_env)
      body = request_env.body
      headers = request_env.request_headers
      overrides = { method: request_env.method.to_s.upcase,
                    idempotency_key: !headers[IDEMPOTENCY_HEADER].nil? }.merge(@overrides)
      Adapter.run(@dependency, @policy, @env, overrides) do |attempt|
        # The adapter replaces the body with the response's: every attempt sends the request's.
        request_env.body = body
        if attempt.timeout
          request_env.request.timeout = attempt.timeout
          headers["grpc-timeout"] = attempt.deadline_header
        end
        @app.call(request_env)
      end
    end
  end

  ::Faraday::Request.register_middleware(retryd: -> { FaradayMiddleware })
end
