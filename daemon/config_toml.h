// daemon/config_toml.h: the config loader's policy reader, for other files that hold policy
// keys in TOML (the simulator's scenarios), so that a key reads the same everywhere.
//
// Thread safety: thread-safe; a pure function of its arguments.
#pragma once

#include <toml++/toml.h>

#include <string>

#include "retryd/status.h"
#include "shm/policy.h"

namespace retryd::daemon {

// ReadPolicyTable applies the policy keys of `table` (a [defaults]-like section called
// `section` in messages, its keys shown as `prefix` + key) over *policy and validates the
// result. On error returns every problem, as ConfigErrorsStatus (config.h) does for a daemon
// config: "SOURCE:LINE:COL: key 'PREFIXKEY': problem", one line each after a count line if
// there are several; *policy may then hold some of the new values.
Status ReadPolicyTable(const toml::table& table, const std::string& source,
                       const std::string& section, const std::string& prefix, shm::Policy* policy);

}  // namespace retryd::daemon
