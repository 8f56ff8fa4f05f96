# frozen_string_literal: true

require "retryd/client"

module Retryd
  # The world a call runs in, for tests: `now_ns` a monotonic clock (-> Integer), `sleep` a
  # proc taking seconds (returning false cancels the call), `random` a uniform 64-bit Integer,
  # `wall_time` Unix seconds (for an HTTP-date Retry-After). nil: the real thing (sleep is
  # Kernel#sleep, so the waiting thread gives up the GVL and a Thread#raise or signal reaches
  # it).
  Env = Struct.new(:now_ns, :sleep, :random, :wall_time, keyword_init: true)

  # The Attempt running on this thread (fiber) inside Dependency#call, else nil.
  def self.current_attempt
    Thread.current[:retryd_attempt]
  end

  # One run of the C library's retry loop (retryd_call) with Ruby callbacks. Every exception
  # raised in a callback is caught before it reaches C (an unwind through the loop is not
  # allowed) and raised again once retryd_call has returned.
  class Call
    ATTEMPT_SIG = [%i[pointer uint32 int64 pointer], :int].freeze

    def initialize(dependency, policy, env)
      @dep = dependency
      @policy = policy
      @env = env || Env.new
      @value = nil
      @exc = nil
      @late_exc = nil
      @keep = []
    end

    def run(&block)
      native_policy, _method_mem = @policy.to_native
      watched = @dep.watched
      attempt_fn = FFI::Function.new(:int, %i[pointer uint32 int64 pointer]) do |_ctx, n, remaining, out|
        # Admitted just now: a probe's half-open shows here.
        observe_state if watched
        attempt(block, n, remaining, Native::AttemptOut.new(out))
      end
      observer_fn = if @policy.observer || watched
                      FFI::Function.new(:void, %i[pointer pointer]) do |_ctx, info|
                        observe_state if watched
                        observe(info) if @policy.observer
                      end
                    end
      c_env, _fns = native_env
      result = Native::CallResult.new
      rc = Native.retryd_call(@dep.client.handle, @dep.id, native_policy, attempt_fn, nil,
                              observer_fn || FFI::Pointer::NULL, nil, c_env, result)
      observe_state if watched
      # _method_mem, the FFI::Functions (attempt_fn, observer_fn, _fns) and @keep are held by
      # this frame and this object until here: the C loop never sees freed memory.
      unless rc == Native::OK
        raise Error, "#{@dep.name}: retryd_call failed: #{Native.retryd_strerror(rc)} (check the policy)"
      end

      finish(result)
    end

    private

    def attempt(block, number, remaining_ms, out)
      timeout = remaining_ms == Native::NO_TIMEOUT ? nil : remaining_ms / 1000.0
      attempt = Attempt.new(number, timeout)
      previous = Thread.current[:retryd_attempt]
      Thread.current[:retryd_attempt] = attempt
      begin
        value = block.call(attempt)
      rescue Exception => e # must stop at the C boundary
        return attempt_raised(e, out)
      ensure
        Thread.current[:retryd_attempt] = previous
      end
      begin
        res = @policy.inspect.call(value)
        @value = res.value
        @exc = nil
        fill(out, res)
      rescue Exception => e
        @value = value
        @exc = e
        return 1
      end
      0
    end

    def attempt_raised(exc, out)
      @value = nil
      @exc = exc
      mapped = exc.is_a?(StandardError) ? @policy.classify_exception.call(exc) : nil
      return 1 if mapped.nil?

      if mapped.is_a?(AttemptResult)
        @value = mapped.value
        fill(out, mapped)
      else
        out[:error_kind] = mapped.is_a?(Symbol) ? ERROR_KINDS.fetch(mapped) : Integer(mapped)
      end
      0
    rescue Exception => e
      @exc = e
      1
    end

    def cstr(text)
      mem = FFI::MemoryPointer.from_string(text.to_s.b)
      @keep << mem
      mem
    end

    def fill(out, res)
      out[:status] = Integer(res.status || 0)
      err = res.error || :none
      out[:error_kind] = err.is_a?(Symbol) ? ERROR_KINDS.fetch(err) : Integer(err)
      ra = res.retry_after
      if ra.is_a?(Numeric)
        out[:retry_after_ms] = [0, (ra * 1000).to_i].max
      elsif !ra.nil?
        out[:retry_after] = cstr(ra)
      end
      out[:date] = cstr(res.date) unless res.date.nil?
      return if res.attempt_class.nil?

      out[:attempt_class] = CLASSES.fetch(res.attempt_class.to_sym)
      breaker = res.breaker || (res.attempt_class.to_sym == :success ? :success : :failure)
      out[:breaker_outcome] = OUTCOMES.fetch(breaker.to_sym)
    end

    # The dependency's state-change subscribers (they never raise into C: observe_state
    # rescues what they raise, and this rescues the rest).
    def observe_state
      @dep.observe_state
    rescue Exception => e
      @late_exc ||= e
    end

    def observe(ptr)
      i = Native::AttemptInfo.new(ptr)
      @policy.observer.call(AttemptInfo.new(
        attempt: i[:attempt],
        decision: ADMISSIONS.fetch(i[:decision], i[:decision]),
        attempt_class: CLASS_NAMES.fetch(i[:attempt_class], i[:attempt_class]),
        breaker: OUTCOME_NAMES.fetch(i[:breaker_outcome], i[:breaker_outcome]),
        status: i[:status],
        error: ERROR_NAMES.fetch(i[:error_kind], i[:error_kind]),
        latency: i[:latency_ns] / 1e9,
        retry_after: i[:retry_after_ns].negative? ? nil : i[:retry_after_ns] / 1e9,
        wait: i[:wait_ns] / 1e9,
        next: STOPS.fetch(i[:next], i[:next])
      ))
    rescue Exception => e
      @late_exc ||= e
    end

    def native_env
      env = Native::CallEnv.new
      fns = []
      sleeper = @env.sleep || ->(s) { Kernel.sleep(s) }
      sleep_fn = FFI::Function.new(:int, %i[pointer int64]) do |_ctx, ns|
        sleeper.call(ns / 1e9) == false ? 1 : 0
      rescue Exception => e # ends the call, then raised
        @late_exc ||= e
        1
      end
      env[:sleep_ns] = sleep_fn
      fns << sleep_fn
      if @env.now_ns
        f = FFI::Function.new(:int64, [:pointer]) { |_| safe(0) { Integer(@env.now_ns.call) } }
        env[:now_ns] = f
        fns << f
      end
      if @env.random
        f = FFI::Function.new(:uint64, [:pointer]) { |_| safe(0) { Integer(@env.random.call) & (2**64 - 1) } }
        env[:random] = f
        fns << f
      end
      if @env.wall_time
        f = FFI::Function.new(:int64, [:pointer]) { |_| safe(0) { (@env.wall_time.call * 1000).to_i } }
        env[:wall_now_ms] = f
        fns << f
      end
      [env, fns]
    end

    def safe(default)
      yield
    rescue Exception => e
      @late_exc ||= e
      default
    end

    def finish(r)
      stop = STOPS.fetch(r[:stop], r[:stop])
      result = CallResult.new(
        stop: stop,
        final_class: CLASS_NAMES.fetch(r[:final_class], r[:final_class]),
        attempts: r[:attempts],
        last_status: r[:last_status],
        last_error: ERROR_NAMES.fetch(r[:last_error_kind], r[:last_error_kind]),
        rejection: stop == :rejected ? ADMISSIONS.fetch(r[:rejection], r[:rejection]) : nil,
        elapsed: r[:elapsed_ns] / 1e9,
        value: @value,
        exception: @exc
      )
      raise @late_exc if @late_exc
      return @value if stop == :success
      raise @exc if stop == :aborted && @exc

      # Raised from inside a rescue of the attempt's exception, so that it becomes the cause.
      error = stop == :rejected ? Rejected.new(result.rejection, @dep.name, result) : CallFailed.new(@dep.name, result)
      raise_with_cause(error, @exc)
    end

    def raise_with_cause(error, cause)
      raise error unless cause

      raise error, cause: cause
    end
  end
end
