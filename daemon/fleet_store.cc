#include "daemon/fleet_store.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <fstream>

namespace retryd::daemon {
namespace {

timeval Timeval(uint32_t ms) {
  return {time_t(ms / 1000), suseconds_t((ms % 1000) * 1000)};
}

StoreReply Convert(const redisReply* r) {
  StoreReply out;
  switch (r->type) {
    case REDIS_REPLY_INTEGER:
      out.type = StoreReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      out.type = StoreReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = StoreReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Convert(r->element[i]));
      break;
    default: break;
  }
  return out;
}

// RunCommand runs `argv` on `ctx`; an error reply is an error.
Status RunCommand(redisContext* ctx, const std::vector<std::string>& argv, StoreReply* out) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(ctx, int(args.size()), args.data(), lens.data()));
  if (r == nullptr) {
    return Status::IoError(argv[0] + ": " + (ctx->err ? std::string(ctx->errstr) : "no reply"));
  }
  Status st;
  if (r->type == REDIS_REPLY_ERROR) {
    st = Status::IoError(argv[0] + ": " + std::string(r->str, r->len));
  } else if (out != nullptr) {
    *out = Convert(r);
  }
  freeReplyObject(r);
  return st;
}

}  // namespace

FleetStore::FleetStore(FleetSettings settings) : settings_(std::move(settings)) {}

FleetStore::~FleetStore() { Disconnect(); }

void FleetStore::Disconnect() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

Status FleetStore::ConnectTo(const std::string& address, bool check_master) {
  address_ = address;
  const timeval tv = Timeval(settings_.timeout_ms);
  redisContext* ctx;
  if (address.rfind("unix:", 0) == 0) {
    ctx = redisConnectUnixWithTimeout(address.c_str() + 5, tv);
  } else {
    const size_t colon = address.rfind(':');
    ctx = redisConnectWithTimeout(address.substr(0, colon).c_str(),
                                  std::stoi(address.substr(colon + 1)), tv);
  }
  if (ctx == nullptr) return Status::IoError(address + ": cannot allocate a connection");
  if (ctx->err) {
    Status st = Status::IoError(address + ": " + ctx->errstr);
    redisFree(ctx);
    return st;
  }
  redisSetTimeout(ctx, tv);
  Status st;
  StoreReply reply;
  if (!password_.empty()) st = RunCommand(ctx, {"AUTH", password_}, nullptr);
  if (st.ok()) st = RunCommand(ctx, {"ROLE"}, &reply);
  if (st.ok() && check_master &&
      (reply.elements.empty() || reply.elements[0].str != "master")) {
    st = Status::IoError("it says it is " +
                         (reply.elements.empty() ? std::string("nothing") : reply.elements[0].str) +
                         ", not the master");
  }
  if (!st.ok()) {
    redisFree(ctx);
    return Status::IoError(address + ": " + st.message());
  }
  ctx_ = ctx;
  return Status::Ok();
}

Status FleetStore::MasterFromSentinels(std::string* address) {
  std::string tried;
  const timeval tv = Timeval(settings_.timeout_ms);
  for (const std::string& sentinel : settings_.sentinels) {
    const size_t colon = sentinel.rfind(':');
    redisContext* ctx = redisConnectWithTimeout(sentinel.substr(0, colon).c_str(),
                                                std::stoi(sentinel.substr(colon + 1)), tv);
    if (ctx == nullptr || ctx->err) {
      tried += "; Sentinel " + sentinel + ": " + (ctx ? ctx->errstr : "cannot allocate");
      if (ctx) redisFree(ctx);
      continue;
    }
    redisSetTimeout(ctx, tv);
    StoreReply reply;
    const Status st = RunCommand(
        ctx, {"SENTINEL", "get-master-addr-by-name", settings_.master_name}, &reply);
    redisFree(ctx);
    if (!st.ok()) {
      tried += "; Sentinel " + sentinel + ": " + st.message();
    } else if (reply.elements.size() != 2) {
      tried += "; Sentinel " + sentinel + ": knows no master \"" + settings_.master_name + "\"";
    } else {
      *address = reply.elements[0].str + ":" + reply.elements[1].str;
      return Status::Ok();
    }
  }
  return Status::IoError("no Sentinel named the master" + tried);
}

Status FleetStore::Connect() {
  Disconnect();
  if (!settings_.password_file.empty()) {
    std::ifstream in(settings_.password_file);
    if (!in) {
      return Status::IoError(settings_.password_file + ": cannot read the password file");
    }
    std::getline(in, password_);
  }
  if (settings_.sentinels.empty()) return ConnectTo(settings_.redis, false);
  std::string master;
  if (Status st = MasterFromSentinels(&master); !st.ok()) return st;
  return ConnectTo(master, true);
}

Status FleetStore::Command(const std::vector<std::string>& argv, StoreReply* out) {
  if (ctx_ == nullptr) return Status::IoError(argv[0] + ": not connected");
  Status st = RunCommand(ctx_, argv, out);
  if (!st.ok()) {
    st = Status::IoError(address_ + ": " + st.message());
    Disconnect();
  }
  return st;
}

}  // namespace retryd::daemon
