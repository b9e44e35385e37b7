// Registration entry points of the microbenchmark files (called from main before the run).
#pragma once

namespace gradex::bench {
void register_dgc(bool large);
void register_wire(bool large);
void register_cast(bool large);
void register_block_codecs(bool large);
// The sealed data plane's AEAD (comm/seal/seal.h): seal and open per cipher, beside a copy.
void register_seal();
}  // namespace gradex::bench
