# frozen_string_literal: true

require "retryd/native"

module Retryd
  LOG_LEVELS = { 0 => :info, 1 => :warn, 2 => :error }.freeze

  class << self
    # Routes the library's log lines (the one line saying a client runs on per-process limits,
    # say) to `logger` (anything with #info, #warn, #error, such as a Logger or Rails.logger);
    # nil restores the default, one line on stderr. The library calls it on the thread that
    # uses the client.
    def logger=(logger)
      Native.load!
      @log_fn = if logger
                  FFI::Function.new(:void, %i[pointer int string]) do |_ctx, level, line|
                    logger.public_send(LOG_LEVELS.fetch(level, :warn), "retryd: #{line}")
                  rescue Exception # never unwind into C
                    nil
                  end
                end
      @logger = logger
      Native.retryd_set_log_callback(@log_fn || FFI::Pointer::NULL, nil)
    end

    attr_reader :logger

    # A state-change subscriber raised: logged through #logger (error), else warned on stderr.
    def log_subscriber_error(name, error) # :nodoc:
      line = "retryd: state-change subscriber of #{name} raised #{error.class}: #{error.message}"
      if @logger
        @logger.error(line)
      else
        warn line
      end
    rescue StandardError
      nil
    end
  end
end
