# Fails if BINARY needs a shared library matching FORBIDDEN (a regex): retryctl runs on hosts
# and in containers where only the segment is shared, and must not drag in the daemon's
# logging, flags or systemd libraries. Run with cmake -DREADELF=... -DBINARY=... -DFORBIDDEN=... -P.
execute_process(COMMAND ${READELF} -d ${BINARY} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BINARY} failed (${rc})")
endif()
string(REGEX MATCHALL "NEEDED[^\n]*" needed "${dynamic}")
foreach(line ${needed})
  if(line MATCHES "${FORBIDDEN}")
    message(FATAL_ERROR "${BINARY} must not need this library: ${line}")
  endif()
endforeach()
message(STATUS "${BINARY}: no library matching ${FORBIDDEN}")
