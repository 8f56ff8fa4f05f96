# frozen_string_literal: true

module Retryd
  # The project's version: the same as CMakeLists.txt's project VERSION (a test checks it).
  VERSION = "0.1.0"
end
