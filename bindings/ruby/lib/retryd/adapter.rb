# frozen_string_literal: true

require "retryd"

module Retryd
  # What a response or exception returned or raised by an HTTP adapter (Retryd::NetHTTP,
  # Retryd::FaradayMiddleware) carries when the loop did not end in success: the call's
  # CallResult (stop, attempts, rejection, last status and error).
  module Tagged
    attr_accessor :retryd_result
  end

  # The outcome of an HTTP adapter's call, the same for every adapter of every binding.
  module Adapter
    module_function

    # Runs dependency.call with the block and returns what the last attempt got: the
    # successful response; when the loop gives up (CallFailed) or the host refuses a retry
    # (Rejected after an attempt went out, the retry budget spent, say), the last attempt's
    # response, or its exception raised again as the client raised it, tagged with the
    # CallResult as `retryd_result`. Rejected is raised only when no request went out (the
    # host refused the first attempt), CallFailed only when no attempt went out at all (no
    # time left for one).
    def run(dependency, policy, env, overrides, &block)
      failure = begin
        return dependency.call(policy, env: env, **overrides, &block)
      rescue CallFailed => e
        e
      rescue Rejected => e
        raise if e.result.nil? || e.result.attempts.zero?

        e
      end
      # Outside the rescue clauses, so that what is raised below keeps its own cause.
      result = failure.result
      if result.exception
        tag(result.exception, result)
        raise result.exception
      end
      raise failure if result.value.nil?

      tag(result.value, result)
    end

    def tag(obj, result)
      obj.extend(Tagged) unless obj.is_a?(Tagged)
      obj.retryd_result = result
      obj
    rescue FrozenError, TypeError
      obj # an object that takes no singleton methods: the result is lost with it
    end
  end
end
