# frozen_string_literal: true

require "ffi"

module Retryd
  # libretryd.so could not be found or loaded.
  class LibraryNotFound < LoadError; end

  # The C ABI of libretryd (retryd.h, retryd_policy.h, retryd_call.h), declared with ruby-ffi.
  #
  # The library is looked up on first use, in this order:
  #   1. the path in $RETRYD_LIBRARY (only that one, when set);
  #   2. its soname, libretryd.so.0, through the dynamic loader (the libretryd0 package, or
  #      LD_LIBRARY_PATH);
  #   3. the build directories of the source tree this gem sits in
  #      (build*/client/libretryd.so).
  # Requiring the gem never fails for want of the library; the first call that needs it raises
  # LibraryNotFound.
  module Native
    extend FFI::Library

    # retryd.h
    OK = 0
    EINVAL = -1
    ENOENT = -2
    EPERM = -3
    EINCOMPATIBLE = -4
    EFULL = -5
    EIO = -6
    ADMITTED = 0
    ADMITTED_PROBE = 1
    REJECTED_OPEN = 2
    REJECTED_HALF_OPEN_BUSY = 3
    REJECTED_BULKHEAD_FULL = 4
    REJECTED_BUDGET_EMPTY = 5
    SUCCESS = 0
    FAILURE = 1
    IGNORED = 2
    STATE_CLOSED = 0
    STATE_OPEN = 1
    STATE_HALF_OPEN = 2

    # retryd_policy.h
    ERROR_NONE = 0
    ERROR_DNS = 1
    ERROR_CONNECT_REFUSED = 2
    ERROR_CONNECTION_RESET = 3
    ERROR_TLS = 4
    ERROR_TIMEOUT = 5
    ERROR_OTHER = 6
    ATTEMPT_SUCCESS = 0
    ATTEMPT_RETRYABLE = 1
    ATTEMPT_TERMINAL = 2
    BREAKER_OUTCOME_SUCCESS = 0
    BREAKER_OUTCOME_FAILURE = 1
    BREAKER_OUTCOME_IGNORED = 2
    JITTER_NONE = 0
    JITTER_FULL = 1
    JITTER_EQUAL = 2
    JITTER_DECORRELATED = 3
    DEADLINE_HEADER_BUFSIZE = 10

    # retryd_call.h
    STOP_NONE = 0
    STOP_SUCCESS = 1
    STOP_TERMINAL = 2
    STOP_ATTEMPTS_EXHAUSTED = 3
    STOP_REJECTED = 4
    STOP_DEADLINE = 5
    STOP_RETRY_AFTER_TOO_LONG = 6
    STOP_CANCELLED = 7
    STOP_ABORTED = 8
    NO_TIMEOUT = 2**63 - 1 # INT64_MAX

    # The soname of the C ABI declared here: client/CMakeLists.txt's SOVERSION.
    SONAME = "libretryd.so.0"

    # retryd_permit_t: 48 bytes the caller owns; `decision` is the last decision.
    class Permit < FFI::Struct
      layout :decision, :int32, :reserved, :uint32, :opaque, [:uint64, 5]
    end

    # retryd_options_t
    class Options < FFI::Struct
      layout :segment, :pointer, :fallback_to_local, :int
    end

    # retryd_call_policy_t
    class CallPolicy < FFI::Struct
      layout :max_attempts, :uint32,
             :jitter, :int,
             :backoff_base_ms, :int64,
             :backoff_cap_ms, :int64,
             :retry_after_jitter_max_ms, :int64,
             :retry_after_max_ms, :int64,
             :deadline_ms, :int64,
             :attempt_timeout_ms, :int64,
             :expected_attempt_ms, :int64,
             :method, :pointer,
             :has_idempotency_key, :int,
             :classifier, :pointer
    end

    # retryd_attempt_result_t
    class AttemptOut < FFI::Struct
      layout :status, :int,
             :error_kind, :int,
             :retry_after_ms, :int64,
             :retry_after, :pointer,
             :date, :pointer,
             :attempt_class, :int,
             :breaker_outcome, :int
    end

    # retryd_attempt_info_t
    class AttemptInfo < FFI::Struct
      layout :attempt, :uint32,
             :decision, :int,
             :attempt_class, :int,
             :breaker_outcome, :int,
             :status, :int,
             :error_kind, :int,
             :latency_ns, :int64,
             :retry_after_ns, :int64,
             :wait_ns, :int64,
             :next, :int
    end

    # retryd_call_env_t: function pointers (FFI::Function objects or NULL).
    class CallEnv < FFI::Struct
      layout :ctx, :pointer,
             :now_ns, :pointer,
             :sleep_ns, :pointer,
             :random, :pointer,
             :wall_now_ms, :pointer
    end

    # retryd_call_result_t
    class CallResult < FFI::Struct
      layout :stop, :int,
             :final_class, :int,
             :attempts, :uint32,
             :last_status, :int,
             :last_error_kind, :int,
             :rejection, :int,
             :elapsed_ns, :int64
    end

    @load_lock = Mutex.new
    @loaded = nil

    class << self
      # The file the library was loaded from (loading it on first use).
      def library_path
        load!
        @loaded
      end

      def loaded?
        !@loaded.nil?
      end

      # Loads the library and attaches its functions, once. Thread-safe.
      def load!
        return if @loaded

        @load_lock.synchronize do
          return if @loaded

          errors = []
          candidates.each do |path|
            begin
              ffi_lib(path)
              attach_all
              @loaded = path
              return
            rescue LoadError, FFI::NotFoundError => e
              errors << "#{path}: #{e.message}"
            end
          end
          raise LibraryNotFound, "libretryd not found; set RETRYD_LIBRARY to its path (" \
                                 "#{errors.join('; ')})"
        end
      end

      def candidates
        env = ENV["RETRYD_LIBRARY"]
        return [env] if env && !env.empty?

        # lib/retryd/native.rb -> bindings/ruby/lib/retryd -> the source tree.
        root = File.expand_path("../../../..", __dir__)
        [SONAME] + Dir.glob(File.join(root, "build*", "client", "libretryd.so")).sort
      end

      def last_error
        msg = retryd_last_error
        msg.nil? ? "" : msg.dup.force_encoding(Encoding::UTF_8).scrub
      end

      private

      def attach_all
        # The hot path: retryd_admit and retryd_complete keep the GVL (they never block).
        attach_function :retryd_open, [Options.ptr, :pointer], :int
        attach_function :retryd_open_socket, [:string, Options.ptr, :pointer], :int
        attach_function :retryd_close, [:pointer], :void
        attach_function :retryd_resolve, %i[pointer string pointer], :int
        attach_function :retryd_admit, %i[pointer int32 uint32 pointer], :int
        attach_function :retryd_complete, %i[pointer pointer int uint64], :void
        attach_function :retryd_is_local, [:pointer], :int
        attach_function :retryd_breaker_state, %i[pointer int32], :int
        attach_function :retryd_strerror, [:int], :string
        attach_function :retryd_decision_name, [:int], :string
        attach_function :retryd_last_error, [], :string
        attach_function :retryd_set_log_callback, %i[pointer pointer], :void
        attach_function :retryd_classifier_new, [], :pointer
        attach_function :retryd_classifier_free, [:pointer], :void
        attach_function :retryd_classifier_set_status, %i[pointer int int int int], :int
        attach_function :retryd_classifier_set_error, %i[pointer int int int int], :int
        attach_function :retryd_classifier_set_idempotent, %i[pointer string int], :int
        attach_function :retryd_format_deadline_header, %i[int64 pointer size_t], :int
        attach_function :retryd_call_policy_init, [:pointer], :void
        attach_function :retryd_call,
                        %i[pointer int32 pointer pointer pointer pointer pointer pointer pointer],
                        :int
        attach_function :retryd_stop_name, [:int], :string
      end
    end
  end
end
