# frozen_string_literal: true

require "retryd/native"
require "retryd/errors"
require "retryd/policy"

module Retryd
  ADMISSIONS = {
    Native::ADMITTED => :admitted,
    Native::ADMITTED_PROBE => :admitted_probe,
    Native::REJECTED_OPEN => :open,
    Native::REJECTED_HALF_OPEN_BUSY => :half_open_busy,
    Native::REJECTED_BULKHEAD_FULL => :bulkhead_full,
    Native::REJECTED_BUDGET_EMPTY => :budget_empty
  }.freeze
  STATES = {
    Native::STATE_CLOSED => :closed,
    Native::STATE_OPEN => :open,
    Native::STATE_HALF_OPEN => :half_open
  }.freeze
  STOPS = {
    Native::STOP_NONE => :retry, Native::STOP_SUCCESS => :success,
    Native::STOP_TERMINAL => :terminal, Native::STOP_ATTEMPTS_EXHAUSTED => :attempts_exhausted,
    Native::STOP_REJECTED => :rejected, Native::STOP_DEADLINE => :deadline,
    Native::STOP_RETRY_AFTER_TOO_LONG => :retry_after_too_long,
    Native::STOP_CANCELLED => :cancelled, Native::STOP_ABORTED => :aborted
  }.freeze

  def self.monotonic_ns
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  end

  # A connection to the host's retryd segment.
  #
  # Client.new(segment: nil, socket: nil, fallback_to_local: true): `socket` is the daemon's
  # Unix socket (its config's `socket`), `segment` a segment name. With neither, the client
  # attaches through $RETRYD_SOCKET if set; else, with $RETRYD_SEGMENT unset, through
  # /run/retryd/retryd.sock if it exists; else it maps the segment $RETRYD_SEGMENT, or
  # "retryd", by name. With no daemon (no segment) and `fallback_to_local`, the client runs on
  # per-process limits with the default policy, says so in one log line, and moves to the
  # host's limits once the daemon answers; without it, ClientError is raised. A segment or
  # daemon that refuses this process raises PermissionError either way.
  #
  # Thread-safe. Fork-safe: a child made by fork (Puma's and Unicorn's workers, Resque,
  # Process.fork) keeps using its parent's client; the library registers the child as a
  # process of its own on its first admission. #close must not race with calls in flight.
  class Client
    def initialize(segment: nil, socket: nil, fallback_to_local: true)
      Native.load!
      opts = Native::Options.new
      seg_mem = segment ? FFI::MemoryPointer.from_string(segment.to_s) : nil
      opts[:segment] = seg_mem || FFI::Pointer::NULL
      opts[:fallback_to_local] = fallback_to_local ? 1 : 0
      out = FFI::MemoryPointer.new(:pointer)
      rc = if socket && !socket.to_s.empty?
             Native.retryd_open_socket(socket.to_s, opts, out)
           else
             Native.retryd_open(opts, out)
           end
      raise_open_error(rc) unless rc == Native::OK

      @handle = out.read_pointer
      @closed = [false] # shared with the finalizer
      @deps = {}
      @lock = Mutex.new
      @subscribers = [].freeze # replaced, never changed in place: read without the lock
      ObjectSpace.define_finalizer(self, self.class.closer(@handle, @closed))
    end

    def self.closer(handle, closed)
      proc do
        unless closed[0]
          closed[0] = true
          Native.retryd_close(handle)
        end
      end
    end

    # Opens a client for the block and closes it afterwards.
    def self.open(**kw)
      client = new(**kw)
      return client unless block_given?

      begin
        yield client
      ensure
        client.close
      end
    end

    # The C handle (for the hot path); raises Error once the client is closed.
    def handle
      raise Error, "retryd client is closed" if @closed[0]

      @handle
    end

    # True while running on per-process state (no segment on the host).
    def local?
      Native.retryd_is_local(handle) != 0
    end

    # The Dependency `name`, resolved once, then cached. Raises ClientError for a bad name
    # (1..47 characters of A-Z a-z 0-9 _ . : -).
    def dependency(name)
      name = name.to_s
      @lock.synchronize do
        @deps[name] ||= begin
          out = FFI::MemoryPointer.new(:int32)
          rc = Native.retryd_resolve(handle, name, out)
          raise ClientError.new(rc, "#{name}: #{Native.last_error}") unless rc == Native::OK

          dep = Dependency.new(self, name, out.read_int32)
          dep.__send__(:watch, true) unless @subscribers.empty?
          dep
        end
      end
    end

    # Calls the block with (name, old, new) whenever this process sees the breaker of any of
    # this client's dependencies (those resolved later included) change state, as
    # Dependency#subscribe does for one. Returns a Subscription.
    def subscribe(&block)
      Subscription.new(self, block)
    end

    # The client's own subscribers (Subscription and Dependency use it).
    attr_reader :subscribers

    # Adds or removes `callback` among `owner`'s subscribers (self or one of its
    # dependencies) and starts or stops reading the states of the dependencies concerned.
    def change_subscribers(owner, callback, add) # :nodoc:
      @lock.synchronize do
        subs = owner.subscribers
        subs = add ? subs + [callback] : subs.reject { |s| s.equal?(callback) }
        owner.__send__(:subscribers=, subs.freeze)
        deps = owner.is_a?(Dependency) ? [owner] : @deps.values
        deps.each { |dep| dep.__send__(:watch, !(dep.subscribers.empty? && @subscribers.empty?)) }
      end
    end

    # Unregisters this process and frees the client. Idempotent.
    def close
      return if @closed[0]

      @closed[0] = true
      Native.retryd_close(@handle)
    end

    def closed?
      @closed[0]
    end

    private

    attr_writer :subscribers

    def raise_open_error(rc)
      msg = Native.last_error
      msg = Native.retryd_strerror(rc).to_s if msg.empty?
      raise PermissionError.new(rc, msg) if rc == Native::EPERM

      raise ClientError.new(rc, msg)
    end
  end

  # An admitted attempt, from Dependency#admit without a block. Report how it ended exactly
  # once, with #complete (:success, :failure, :ignored). With a block, #admit does it.
  class Permit
    attr_reader :dependency, :attempt

    def initialize(dependency, attempt, raw)
      @dependency = dependency
      @attempt = attempt
      @raw = raw
      @start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
      @outcome = nil
      @done = false
    end

    # True if this attempt is the breaker's half-open probe.
    def probe?
      @raw.unpack1("l") == Native::ADMITTED_PROBE
    end

    # Report a failure (counts toward the breaker) at the end of the admit block.
    def fail!
      @outcome = Native::FAILURE
    end

    # Report the attempt as ignored at the end of the block: the caller's fault (a 4xx), not
    # the dependency's; the breaker does not see it.
    def ignore!
      @outcome = Native::IGNORED
    end

    # Report a success at the end of the block, even if the block raises.
    def succeed!
      @outcome = Native::SUCCESS
    end

    # The outcome chosen by fail!/ignore!/succeed!, or nil.
    attr_reader :outcome

    # Reports the outcome (:success, :failure, :ignored, or the one chosen by fail!, ignore!,
    # succeed!; default :success) now. A second call is a no-op.
    def complete(outcome = nil)
      code = case outcome
             when nil then @outcome || Native::SUCCESS
             when Symbol, String then OUTCOMES.fetch(outcome.to_sym)
             else Integer(outcome)
             end
      finish(code)
    end

    # Reports `code` (a RETRYD_SUCCESS... value) unless done already: the hot path's complete.
    def finish(code)
      return if @done

      @done = true
      latency = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - @start
      Native.retryd_complete(@dependency.client.handle, @raw, code, latency.negative? ? 0 : latency)
      @dependency.observe_state if @dependency.watched
    end

    def completed?
      @done
    end
  end

  # A downstream dependency, from Client#dependency(name). Thread-safe.
  class Dependency
    ZERO = "\0".b.freeze
    PERMIT_SIZE = Native::Permit.size
    attr_reader :client, :name, :id, :subscribers, :watched

    def initialize(client, name, id)
      @client = client
      @name = name
      @id = id
      # State-change subscriptions: while @watched is false (no subscriber here or on the
      # client), admissions and completions never read the breaker's state.
      @subscribers = [].freeze
      @watched = false
      @last_state = nil # the last state this process saw, while watched
      @state_lock = Mutex.new
    end

    # The breaker's state as this process sees it now: :closed, :open or :half_open (a
    # breaker whose open period has ended reads :open until the next admission).
    def state
      s = Native.retryd_breaker_state(@client.handle, @id)
      raise Error, "#{@name}: #{Native.last_error}" if s.negative?

      STATES.fetch(s, s)
    end

    # Calls the block with (name, old, new) whenever this process sees this dependency's
    # breaker change state (:closed, :open, :half_open), as Semian.subscribe's :state_change
    # event: after each of its admissions and completions (#admit, each attempt of #call, the
    # adapters) the state is read and compared with the last one seen. A change made by another
    # process is seen at this process's next call; a change undone between two calls is not
    # seen. The block runs on the calling thread, inside the call; an exception it raises is
    # logged (Retryd.logger, else a warning on stderr) and the call goes on. Returns a
    # Subscription: #unsubscribe stops the calls, and with no subscriber left the state is not
    # read at all. Thread-safe.
    def subscribe(&block)
      Subscription.new(self, block)
    end

    # Reads the state and calls the subscribers if it changed (the hot path calls it only
    # while watched).
    def observe_state # :nodoc:
      s = read_state
      return if s.nil?

      old = @state_lock.synchronize do
        prev = @last_state
        return if prev == s

        @last_state = s
        prev
      end
      return if old.nil?

      old_name = STATES.fetch(old, old)
      new_name = STATES.fetch(s, s)
      (@subscribers + @client.subscribers).each do |callback|
        # Unsubscribed by a subscriber called before it for this change: not called.
        next unless @subscribers.include?(callback) || @client.subscribers.include?(callback)

        callback.call(@name, old_name, new_name)
      rescue StandardError => e
        Retryd.log_subscriber_error(@name, e)
      end
    end

    def inspect
      "#<Retryd::Dependency #{@name.inspect}>"
    end

    # Asks whether attempt number `attempt` (0: first attempt, 1: first retry...) may go out
    # now; raises Rejected with the reason when not.
    #
    # With a block: runs it and reports a success when it returns, a failure when it raises
    # (and re-raises), unless the block chose otherwise through the permit it is given
    # (permit.ignore! for a 4xx, permit.fail! for a bad answer). Returns the block's value.
    # Without a block: returns the Permit; call permit.complete exactly once.
    def admit(attempt = 0)
      # A binary String is the cheapest caller-owned 48-byte buffer Ruby has; the library keeps
      # no pointer to it (retryd.h: permits are plain caller-owned structs).
      # (A fresh String each time: a dup would share the frozen template's bytes.)
      raw = ZERO * PERMIT_SIZE
      handle = @client.handle
      decision = Native.retryd_admit(handle, @id, attempt, raw)
      if @watched
        begin
          observe_state
        rescue Exception # a subscriber's Interrupt, say: nothing was sent, so the
          # admission is given back
          Native.retryd_complete(handle, raw, Native::IGNORED, 0)
          raise
        end
      end
      if decision != Native::ADMITTED && decision != Native::ADMITTED_PROBE
        # The contract: every admission is completed (for a refusal, a no-op).
        Native.retryd_complete(handle, raw, Native::IGNORED, 0)
        raise Error, "#{@name}: invalid dependency handle" if decision.negative?

        raise Rejected.new(ADMISSIONS.fetch(decision, decision), @name)
      end
      permit = Permit.new(self, attempt, raw)
      return permit unless block_given?

      begin
        value = yield permit
      rescue Exception # reported, then re-raised
        permit.finish(permit.outcome || Native::FAILURE)
        raise
      end
      permit.finish(permit.outcome || Native::SUCCESS)
      value
    end

    # Calls the block with an Attempt under the retry policy (the C library's loop) and
    # returns its value.
    #
    # Each attempt is admitted by the host, the block runs with the attempt's number and
    # timeout, its value or exception is classified (Policy#inspect,
    # Policy#classify_exception) and reported, and the call is retried with backoff, jitter and
    # the server's Retry-After while the policy, the retry budget and the deadline allow.
    # `overrides` change fields of `policy` (default Policy.new) for this call; `env` is an
    # Env for tests (virtual time).
    #
    # Raises Rejected when an attempt is not admitted (serve a fallback), CallFailed when the
    # call gives up, and an exception the policy does not map (a bug in the block, say) as is,
    # after reporting that attempt as a failure and without retrying.
    def call(policy = nil, env: nil, **overrides, &block)
      raise ArgumentError, "Dependency#call needs a block" unless block

      policy = (policy || Policy.new).with(**overrides)
      Call.new(self, policy, env).run(&block)
    end

    # A callable that runs `block` through #call with this policy each time: the Ruby
    # counterpart of a retry decorator.
    #
    #   fetch = orders.retry(deadline: 2.0) { |attempt, id| http.get("/orders/#{id}") }
    #   fetch.call(42)
    def retry(policy = nil, env: nil, **overrides, &block)
      fixed = (policy || Policy.new).with(**overrides)
      ->(*args) { call(fixed, env: env) { |attempt| block.call(attempt, *args) } }
    end
  
    private

    attr_writer :subscribers

    # Called under the client's lock. Starting to watch reads the state to compare with.
    def watch(on)
      if on && !@watched
        @state_lock.synchronize { @last_state = read_state }
      elsif !on
        @last_state = nil
      end
      @watched = on
    end

    def read_state
      return nil if @client.closed?

      s = Native.retryd_breaker_state(@client.handle, @id)
      s.negative? ? nil : s
    end
  end

  # A state-change subscription, from Dependency#subscribe or Client#subscribe. #unsubscribe
  # ends it (a second call is a no-op).
  class Subscription
    attr_reader :callback

    def initialize(owner, callback)
      raise ArgumentError, "subscribe needs a block" unless callback

      @owner = owner
      @client = owner.is_a?(Client) ? owner : owner.client
      @callback = callback
      @active = true
      @client.change_subscribers(owner, callback, true)
    end

    def unsubscribe
      return unless @active

      @active = false
      @client.change_subscribers(@owner, @callback, false)
    end

    def active?
      @active
    end
  end
end
