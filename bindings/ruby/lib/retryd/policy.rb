# frozen_string_literal: true

require "retryd/native"

module Retryd
  ERROR_KINDS = {
    none: Native::ERROR_NONE,
    dns: Native::ERROR_DNS,
    connect_refused: Native::ERROR_CONNECT_REFUSED,
    connection_reset: Native::ERROR_CONNECTION_RESET,
    tls: Native::ERROR_TLS,
    timeout: Native::ERROR_TIMEOUT,
    other: Native::ERROR_OTHER
  }.freeze
  ERROR_NAMES = ERROR_KINDS.invert.freeze
  CLASSES = { success: Native::ATTEMPT_SUCCESS, retryable: Native::ATTEMPT_RETRYABLE,
              terminal: Native::ATTEMPT_TERMINAL }.freeze
  CLASS_NAMES = CLASSES.invert.freeze
  OUTCOMES = { success: Native::SUCCESS, failure: Native::FAILURE,
               ignored: Native::IGNORED }.freeze
  OUTCOME_NAMES = OUTCOMES.invert.freeze
  JITTERS = { none: Native::JITTER_NONE, full: Native::JITTER_FULL, equal: Native::JITTER_EQUAL,
              decorrelated: Native::JITTER_DECORRELATED }.freeze

  # What one attempt reports, when a plain return value does not say it. Return one from the
  # attempt block (or from Policy#inspect) to give the status, the transport error, the
  # server's Retry-After and Date headers, or a classification of your own (attempt_class
  # :success, :retryable, :terminal, with breaker :success, :failure, :ignored); `value` is
  # what Dependency#call returns on success.
  AttemptResult = Struct.new(:value, :status, :error, :retry_after, :date, :attempt_class,
                             :breaker, keyword_init: true) do
    def initialize(**kw)
      super
      self.status ||= 0
      self.error ||= :none
    end
  end

  # What the attempt block is told: its number (0 for the first attempt) and the time it has,
  # in seconds (nil when unbounded). Pass `timeout` to the request, and `deadline_header`
  # (the gRPC timeout format) downstream as the grpc-timeout header.
  Attempt = Struct.new(:number, :timeout) do
    def deadline_header
      return nil if timeout.nil?

      buf = FFI::MemoryPointer.new(:char, Native::DEADLINE_HEADER_BUFSIZE)
      n = Native.retryd_format_deadline_header((timeout * 1e9).to_i, buf,
                                               Native::DEADLINE_HEADER_BUFSIZE)
      n.negative? ? nil : buf.read_string(n)
    end
  end

  # What the observer sees after each admission. Times in seconds.
  AttemptInfo = Struct.new(:attempt, :decision, :attempt_class, :breaker, :status, :error,
                           :latency, :retry_after, :wait, :next, keyword_init: true)

  # How a call ended. Times in seconds.
  CallResult = Struct.new(:stop, :final_class, :attempts, :last_status, :last_error,
                          :rejection, :elapsed, :value, :exception, keyword_init: true)

  # Maps Ruby results and exceptions onto the classification inputs of the C library.
  module Classify
    module_function

    def header(headers, name)
      return nil if headers.nil?

      value = if headers.respond_to?(:[])
                headers[name] || headers[name.downcase]
              end
      value = value.first if value.is_a?(Array)
      value&.to_s
    end

    # The default Policy#inspect: an AttemptResult as is; a Net::HTTPResponse (its `code`),
    # a Faraday::Response or a Rack-like response (an integer `status`) is an HTTP response
    # whose headers give Retry-After and Date; a Rack triple [status, headers, body] too;
    # anything else is a success.
    def inspect_value(value)
      return value if value.is_a?(AttemptResult)

      status, headers = response_parts(value)
      if status
        return AttemptResult.new(value: value, status: status,
                                 retry_after: header(headers, "Retry-After"),
                                 date: header(headers, "Date"))
      end
      AttemptResult.new(value: value, attempt_class: :success, breaker: :success)
    end

    def response_parts(value)
      if defined?(Net::HTTPResponse) && value.is_a?(Net::HTTPResponse)
        return [value.code.to_i, value]
      end
      if value.is_a?(Array) && value.size == 3 && value[0].is_a?(Integer)
        return [value[0], value[1]]
      end
      if value.respond_to?(:status)
        status = value.status
        return [status, value.respond_to?(:headers) ? value.headers : nil] if status.is_a?(Integer)
      end
      nil
    end

    TIMEOUT_NAMES = %w[Timeout::Error Net::OpenTimeout Net::ReadTimeout Net::WriteTimeout
                       Faraday::TimeoutError IO::TimeoutError].freeze
    TLS_NAMES = %w[OpenSSL::SSL::SSLError Faraday::SSLError].freeze

    def const(name)
      name.split("::").inject(Object) { |mod, part| mod.const_get(part, false) }
    rescue NameError
      nil
    end

    def kind_of_any?(exc, names)
      names.any? do |n|
        klass = const(n)
        klass && exc.is_a?(klass)
      end
    end

    # The transport error kind `exc`'s own class names, and whether it decides: a socket-level
    # error does, and so does a timeout (the request may have been sent). A client's generic
    # connection error does not: the exception it wraps may say more.
    def own_kind(exc)
      return [:dns, true] if exc.is_a?(SocketError) || kind_of_any?(exc, %w[Resolv::ResolvError])
      return [:connect_refused, true] if exc.is_a?(Errno::ECONNREFUSED)
      if exc.is_a?(Errno::ECONNRESET) || exc.is_a?(Errno::ECONNABORTED) ||
         exc.is_a?(Errno::EPIPE) || exc.is_a?(EOFError)
        return [:connection_reset, true]
      end
      return [:timeout, true] if exc.is_a?(Errno::ETIMEDOUT) || kind_of_any?(exc, TIMEOUT_NAMES)
      return [:tls, true] if kind_of_any?(exc, TLS_NAMES)
      return [:other, false] if exc.is_a?(SystemCallError) || exc.is_a?(IOError) ||
                                kind_of_any?(exc, %w[Faraday::ConnectionFailed])

      [nil, false]
    end

    CHAIN_LIMIT = 64

    # The default Policy#classify_exception: a transport error kind, an AttemptResult, or nil.
    #
    # SocketError (a failed lookup) is :dns, Errno::ECONNREFUSED :connect_refused, a reset,
    # abort, broken pipe or EOF :connection_reset, OpenSSL's and Faraday's SSL errors :tls,
    # Timeout::Error, Net::OpenTimeout/ReadTimeout/WriteTimeout, Errno::ETIMEDOUT and
    # Faraday::TimeoutError :timeout, any other SystemCallError, IOError or
    # Faraday::ConnectionFailed :other. The cause chain (Exception#cause, and the exception a
    # Faraday error wraps) is followed, nearest first: the first specific kind or timeout
    # decides. A Faraday::ClientError/ServerError with a response (raise_error middleware) is
    # that response's status. nil (anything else, a bug in the block say) ends the call at
    # once: the attempt counts as a failure and the exception propagates.
    def classify_exception(exc)
      if exc.respond_to?(:response) && exc.response.is_a?(Hash) && exc.response[:status]
        r = exc.response
        return AttemptResult.new(value: exc, status: r[:status].to_i,
                                 retry_after: header(r[:headers], "Retry-After"),
                                 date: header(r[:headers], "Date"))
      end
      fallback = nil
      queue = [exc]
      seen = { exc.object_id => true }
      until queue.empty?
        current = queue.shift
        kind, decides = own_kind(current)
        return kind if decides

        fallback ||= kind
        inner = [current.cause]
        inner << current.wrapped_exception if current.respond_to?(:wrapped_exception)
        inner.each do |e|
          next unless e.is_a?(Exception) && !seen[e.object_id] && seen.size < CHAIN_LIMIT

          seen[e.object_id] = true
          queue << e
        end
      end
      fallback
    end
  end

  # A classification table of one's own: the library's defaults (classify.h), then overrides.
  # Configure it before sharing it between threads.
  class Classifier
    attr_reader :handle

    def initialize
      Native.load!
      @handle = Native.retryd_classifier_new
      raise NoMemoryError, "retryd_classifier_new" if @handle.null?

      ObjectSpace.define_finalizer(self, self.class.releaser(@handle))
    end

    def self.releaser(handle)
      proc { Native.retryd_classifier_free(handle) }
    end

    # Sets the rule for one HTTP status (100..599).
    def set_status(status, attempt_class, breaker, retry_unsafe: false)
      check(Native.retryd_classifier_set_status(@handle, Integer(status), CLASSES.fetch(attempt_class),
                                                OUTCOMES.fetch(breaker), retry_unsafe ? 1 : 0),
            "status #{status}")
    end

    # Sets the rule for a transport error kind (:timeout, ...).
    def set_error(error, attempt_class, breaker, retry_unsafe: false)
      check(Native.retryd_classifier_set_error(@handle, ERROR_KINDS.fetch(error), CLASSES.fetch(attempt_class),
                                               OUTCOMES.fetch(breaker), retry_unsafe ? 1 : 0),
            "error #{error}")
    end

    # Adds `method` to, or removes it from, the methods safe to repeat.
    def set_idempotent(method, idempotent = true)
      check(Native.retryd_classifier_set_idempotent(@handle, method.to_s, idempotent ? 1 : 0),
            "method #{method}")
    end

    private

    def check(rc, what)
      raise ArgumentError, "#{what}: invalid rule" unless rc.zero?

      self
    end
  end

  # How Dependency#call retries. Times are in seconds; the defaults are the C library's.
  #
  # max_attempts: attempts per call, the first included.
  # jitter, base, cap: exponential backoff, min(cap, base * 2**n), with :full, :equal,
  #   :decorrelated or :none jitter.
  # retry_after_jitter: added to a server's Retry-After, so "Retry-After: 0" is no tight loop.
  # retry_after_max: a longer Retry-After ends the call instead of retrying earlier than asked.
  # deadline: total budget, waits included (nil: none; a synchronous caller should set one).
  # attempt_timeout: each attempt's own timeout, clamped to what is left of the deadline.
  # expected_attempt: no attempt starts with less time left (nil: the slowest attempt so far).
  # method, idempotency_key: a "POST" without an idempotency key fails closed on an ambiguous
  #   error (a timeout) instead of risking a double effect.
  # classifier: a Classifier with overrides of the default table.
  # inspect: maps an attempt's value to an AttemptResult (Classify.inspect_value).
  # classify_exception: maps an attempt's exception (Classify.classify_exception).
  # observer: called with an AttemptInfo after each admission; an exception it raises is
  #   raised again when the call returns.
  class Policy
    FIELDS = {
      max_attempts: 3, jitter: :full, base: 0.1, cap: 10.0, retry_after_jitter: 0.1,
      retry_after_max: 30.0, deadline: nil, attempt_timeout: nil, expected_attempt: nil,
      method: "GET", idempotency_key: false, classifier: nil,
      inspect: Classify.method(:inspect_value),
      classify_exception: Classify.method(:classify_exception), observer: nil
    }.freeze

    attr_reader(*FIELDS.keys)

    def initialize(**fields)
      unknown = fields.keys - FIELDS.keys
      raise ArgumentError, "unknown policy field(s): #{unknown.join(', ')}" unless unknown.empty?

      FIELDS.each { |k, v| instance_variable_set("@#{k}", fields.fetch(k, v)) }
      @jitter = @jitter.to_sym
      raise ArgumentError, "jitter must be one of #{JITTERS.keys.join(', ')}, got #{@jitter.inspect}" \
        unless JITTERS.key?(@jitter)

      freeze
    end

    # A copy with `changes` applied.
    def with(**changes)
      return self if changes.empty?

      Policy.new(**to_h, **changes)
    end

    def to_h
      FIELDS.keys.to_h { |k| [k, public_send(k)] }
    end

    # Fills a Native::CallPolicy; returns it and the memory it points to (keep both alive).
    def to_native
      c = Native::CallPolicy.new
      Native.retryd_call_policy_init(c)
      c[:max_attempts] = [1, Integer(max_attempts)].max
      c[:jitter] = JITTERS.fetch(jitter)
      c[:backoff_base_ms] = ms(base)
      c[:backoff_cap_ms] = ms(cap)
      c[:retry_after_jitter_max_ms] = ms(retry_after_jitter)
      c[:retry_after_max_ms] = ms(retry_after_max)
      c[:deadline_ms] = deadline.nil? ? -1 : [0, ms(deadline)].max
      c[:attempt_timeout_ms] = attempt_timeout.nil? ? -1 : [1, ms(attempt_timeout)].max
      c[:expected_attempt_ms] = expected_attempt.nil? ? 0 : [0, ms(expected_attempt)].max
      method_mem = FFI::MemoryPointer.from_string(method.to_s)
      c[:method] = method_mem
      c[:has_idempotency_key] = idempotency_key ? 1 : 0
      c[:classifier] = classifier ? classifier.handle : FFI::Pointer::NULL
      [c, method_mem]
    end

    private

    def ms(seconds)
      (seconds * 1000).round
    end
  end
end
