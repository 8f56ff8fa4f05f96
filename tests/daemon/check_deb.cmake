# check_deb.cmake: configure a release build of SOURCE_DIR without tests in WORK_DIR/build
# (prefix /usr, as a Debian build does, so that paths configured into files match the package),
# package it with cpack -G DEB, unpack it with dpkg-deb and check what it holds.
# Usage: cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DEXPECT_RETRYCTL=ON|OFF
#              -P check_deb.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(build "${WORK_DIR}/build")
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
endfunction()
run(configure ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr
    -DRETRYD_BUILD_TESTS=OFF -DRETRYD_BUILD_BENCHMARKS=OFF)
run(build ${CMAKE_COMMAND} --build "${build}" -j 2)
run(cpack ${CMAKE_CPACK_COMMAND} -G DEB -B "${WORK_DIR}" --config "${build}/CPackConfig.cmake")
file(GLOB debs "${WORK_DIR}/*.deb")
list(LENGTH debs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one .deb in ${WORK_DIR}, found: ${debs}")
endif()
run("dpkg-deb -x" dpkg-deb -x "${debs}" "${WORK_DIR}/root")
run("dpkg-deb -e" dpkg-deb -e "${debs}" "${WORK_DIR}/control")

set(root "${WORK_DIR}/root")
set(expected
  usr/sbin/retryd
  usr/include/retryd/retryd.h
  usr/include/retryd/status.h
  usr/lib/systemd/system/retryd.service
  usr/lib/sysusers.d/retryd.conf
  etc/retryd/retryd.toml
  control/conffiles
  control/postinst)
if(EXPECT_RETRYCTL)
  list(APPEND expected usr/bin/retryctl)
endif()
set(missing "")
foreach(f ${expected})
  if(f MATCHES "^control/")
    if(NOT EXISTS "${WORK_DIR}/${f}")
      list(APPEND missing "${f}")
    endif()
  elseif(NOT EXISTS "${root}/${f}")
    list(APPEND missing "${f}")
  endif()
endforeach()
# Library, pkg-config and CMake package files live under the (possibly multiarch) libdir.
file(GLOB_RECURSE all LIST_DIRECTORIES false RELATIVE "${root}" "${root}/*")
foreach(regex "^usr/lib/(.*/)?libretryd\\.so" "^usr/lib/(.*/)?libretryd\\.a$"
              "^usr/lib/(.*/)?pkgconfig/retryd\\.pc$"
              "^usr/lib/(.*/)?cmake/retryd/retrydConfig\\.cmake$"
              "^usr/lib/(.*/)?cmake/retryd/retrydTargets\\.cmake$")
  set(hits ${all})
  list(FILTER hits INCLUDE REGEX "${regex}")
  if(NOT hits)
    list(APPEND missing "${regex}")
  endif()
endforeach()
if(missing)
  string(REPLACE ";" "\n  " all_lines "${all}")
  message(FATAL_ERROR "missing from the package: ${missing}\npackage holds:\n  ${all_lines}")
endif()
# The unit names the installed binary and config.
file(READ "${root}/usr/lib/systemd/system/retryd.service" unit)
if(NOT unit MATCHES "ExecStart=/usr/sbin/retryd --config=/etc/retryd/retryd.toml")
  message(FATAL_ERROR "unit ExecStart does not name /usr/sbin/retryd and /etc/retryd/retryd.toml:\n${unit}")
endif()
set(pc ${all})
list(FILTER pc INCLUDE REGEX "pkgconfig/retryd\\.pc$")
file(READ "${root}/${pc}" pc_text)
if(NOT pc_text MATCHES "prefix=/usr\n")
  message(FATAL_ERROR "${pc} does not say prefix=/usr:\n${pc_text}")
endif()
file(READ "${WORK_DIR}/control/conffiles" conffiles)
if(NOT conffiles MATCHES "/etc/retryd/retryd.toml")
  message(FATAL_ERROR "conffiles does not list the config: ${conffiles}")
endif()
list(LENGTH all count)
message(STATUS "package OK: ${debs} (${count} files)")
