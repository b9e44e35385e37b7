// The framing of several tensors' payloads in one message (one pipeline unit of DGC tensors, one
// rank's part of an allgatherv): [u32 payload count], then per payload [u64 length][payload].
// The count lets a receiver name ranks that cut different units; each payload is a complete
// wire::encode payload (codec.h) and is validated on its own when decoded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradex::compress::wire {

using PayloadSpan = std::pair<const uint8_t*, size_t>;

// Writing: begin_message() once, then per payload begin_payload(), append the payload's bytes
// (encode_append), end_payload() with begin_payload()'s result.
void begin_message(std::vector<uint8_t>& message, uint32_t count);
size_t begin_payload(std::vector<uint8_t>& message);
void end_payload(std::vector<uint8_t>& message, size_t at);

// Reading: the payload count a message announces, then the payloads themselves (pointers into
// `data`). CorruptPayload naming `what` when the message is truncated, holds another count than
// `expected`, or has trailing bytes.
uint32_t message_count(const uint8_t* data, size_t size, const std::string& what);
void split_message(const uint8_t* data, size_t size, size_t expected, const std::string& what,
                   std::vector<PayloadSpan>& payloads);

}  // namespace gradex::compress::wire
