#include "base/error.h"

namespace gradex {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kConfig:
      return "configuration error";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kPeer:
      return "peer failure";
    case ErrorCode::kCorrupt:
      return "corrupt payload";
    case ErrorCode::kMismatch:
      return "mismatch across ranks";
    case ErrorCode::kTransport:
      return "transport error";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kState:
      return "state error";
    case ErrorCode::kVersion:
      return "API version mismatch";
    case ErrorCode::kAborted:
      return "aborted";
  }
  return "unknown error";
}

static std::string peer_message(const std::string& operation, int peer, const std::string& detail) {
  std::string msg = operation;
  if (peer >= 0) msg += " with peer rank " + std::to_string(peer);
  msg += ": " + detail;
  return msg;
}

PeerFailure::PeerFailure(ErrorCode code, std::string operation, int peer, const std::string& detail)
    : Error(code, peer_message(operation, peer, detail)),
      operation_(std::move(operation)),
      peer_(peer) {}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks)
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "[" + s + "]";
}

}  // namespace gradex
