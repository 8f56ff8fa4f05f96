# Stands in for a tool that was not found when cmake ran, and fails saying which Debian
# package has it. Run as: cmake -DMISSING=promtool -DPACKAGE=prometheus -P missing_tool.cmake
message(FATAL_ERROR "${MISSING} was not found when cmake ran. Install Debian's package "
                    "${PACKAGE} (apt-get install ${PACKAGE}; scripts/test does), then re-run "
                    "cmake -S <source> -B <build>.")
