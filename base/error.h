// Typed exceptions used inside gradex's C++ layers. The C API (capi/) converts each to a status
// code plus message; nothing here ever crosses into a framework.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace gradex {

// Stable codes shared with the C API (include/gradex/gradex.h mirrors these values).
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // caller passed something wrong (bad shape, unknown key, bad option)
  kConfig = 2,           // a GRADEX_* variable or API-set option is invalid
  kTimeout = 3,          // a blocking operation ran past GRADEX_TIMEOUT_S
  kPeer = 4,             // a peer died, closed its endpoint or reported a failure
  kCorrupt = 5,          // a payload failed validation (magic, version, lengths, checksum, indices)
  kMismatch = 6,         // ranks disagree (tensor keys, sizes, dtypes, world size)
  kTransport = 7,        // the transport (UCX, sockets) failed locally
  kInternal = 8,         // a broken invariant inside gradex: a bug
  kState = 9,     // checkpointed state cannot be restored here (version, world size, tensor set)
  kVersion = 10,  // a plugin built for another C API version
  kAborted = 11,  // gradex_engine_abort (here or on a peer) or a reconfiguration ended the work
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define GRADEX_DEFINE_ERROR(Name, Code)                                      \
  class Name : public Error {                                                \
   public:                                                                   \
    explicit Name(const std::string& what) : Error(ErrorCode::Code, what) {} \
  }

GRADEX_DEFINE_ERROR(InvalidArgument, kInvalidArgument);
GRADEX_DEFINE_ERROR(ConfigError, kConfig);
GRADEX_DEFINE_ERROR(CorruptPayload, kCorrupt);
GRADEX_DEFINE_ERROR(MismatchError, kMismatch);
GRADEX_DEFINE_ERROR(TransportError, kTransport);
GRADEX_DEFINE_ERROR(InternalError, kInternal);
GRADEX_DEFINE_ERROR(StateError, kState);
#undef GRADEX_DEFINE_ERROR

// Failures that involve a specific peer carry its rank (-1 when unknown) and the operation.
class PeerFailure : public Error {
 public:
  PeerFailure(ErrorCode code, std::string operation, int peer, const std::string& detail);
  const std::string& operation() const noexcept { return operation_; }
  int peer() const noexcept { return peer_; }

 private:
  std::string operation_;
  int peer_;
};

class TimeoutError : public PeerFailure {
 public:
  TimeoutError(std::string operation, int peer, const std::string& detail)
      : PeerFailure(ErrorCode::kTimeout, std::move(operation), peer, detail) {}
};

class PeerError : public PeerFailure {
 public:
  PeerError(std::string operation, int peer, const std::string& detail)
      : PeerFailure(ErrorCode::kPeer, std::move(operation), peer, detail) {}
};

// How error messages name a set of ranks: "[0, 2, 3]".
std::string rank_list(const std::vector<int>& ranks);

}  // namespace gradex
