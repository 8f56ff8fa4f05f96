# frozen_string_literal: true

module Retryd
  # Base class of the errors this gem raises.
  class Error < StandardError; end

  # A cold-path call failed (open, resolve): `code` is the C library's RETRYD_E* value.
  class ClientError < Error
    attr_reader :code

    def initialize(code, message)
      super(message)
      @code = code
    end
  end

  # The segment exists (or the daemon answers) but refuses this process: never hidden behind
  # the per-process fallback.
  class PermissionError < ClientError; end

  # The host refused the attempt: serve a fallback.
  #
  # `reason` is :open (breaker open or forced open), :half_open_busy (the half-open probe is
  # out), :bulkhead_full or :budget_empty (a retry, and the host's retry budget is spent).
  # From Dependency#call, `result` is the CallResult (attempts made before the refusal, the
  # last value); from Dependency#admit it is nil.
  class Rejected < Error
    attr_reader :reason, :dependency, :result

    def initialize(reason, dependency = nil, result = nil)
      super(dependency ? "#{dependency}: rejected: #{reason}" : "rejected: #{reason}")
      @reason = reason
      @dependency = dependency
      @result = result
    end
  end

  # Dependency#call gave up: `result.stop` says why (:terminal, :attempts_exhausted,
  # :deadline, :retry_after_too_long, :cancelled), `result.value` is the last attempt's value
  # (a 4xx response, say), and `cause` is the last attempt's exception, if any.
  class CallFailed < Error
    attr_reader :dependency, :result

    def initialize(dependency, result)
      super("#{dependency}: gave up (#{result.stop}) after #{result.attempts} attempt(s), " \
            "last status #{result.last_status}, last error #{result.last_error}")
      @dependency = dependency
      @result = result
    end
  end
end
