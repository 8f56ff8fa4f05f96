// daemon/fleet_store.h: the fleet's Redis as the daemon's fleet thread sees it: one connection,
// to a standalone server or to the master a set of Sentinels names, every command bounded by
// the [fleet] timeout.
//
// Connect finds the store (Sentinel: the first Sentinel that answers names the master, which
// must then say it is the master: a Sentinel that has not yet seen a failover is not trusted
// blindly), authenticates with the password file's first line, and checks the store answers.
// Any failed command (an error reply included: a demoted master answers READONLY) drops the
// connection: the next Connect asks the Sentinels again, which is how a failover is followed.
//
// Thread safety: not thread-safe; the fleet thread owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "retryd/status.h"

struct redisContext;

namespace retryd::daemon {

// One reply, as plain values.
struct StoreReply {
  enum class Type { kNil, kInteger, kString, kArray };
  Type type = Type::kNil;
  int64_t integer = 0;
  std::string str;
  std::vector<StoreReply> elements;
};

class FleetStore {
 public:
  explicit FleetStore(FleetSettings settings);
  ~FleetStore();
  FleetStore(const FleetStore&) = delete;
  FleetStore& operator=(const FleetStore&) = delete;

  // Connect drops any connection and connects anew (see above). On error the store stays
  // disconnected and the status names each address tried and what it said.
  Status Connect();
  void Disconnect();
  bool connected() const { return ctx_ != nullptr; }
  // Where the connection goes ("10.0.0.5:6379", "unix:/run/redis.sock"), or the last tried.
  const std::string& address() const { return address_; }

  // Command runs one command. An error (connection, timeout, or an error reply) disconnects
  // and is returned with the command's name.
  Status Command(const std::vector<std::string>& argv, StoreReply* out);

 private:
  Status ConnectTo(const std::string& address, bool check_master);
  Status MasterFromSentinels(std::string* address);

  FleetSettings settings_;
  std::string password_;
  redisContext* ctx_ = nullptr;
  std::string address_;
};

}  // namespace retryd::daemon
