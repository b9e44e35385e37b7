// Every rank's entry in a bootstrap store, read in as few round trips to the store's host as the
// world size allows. Each get is a round trip to that host (two through torch.distributed's
// TCPStore, which waits for the key first): across a WAN a rank that read its P - 1 peers' entries
// one by one spent 9 round trips of 50 ms on 4 ranks (the address exchange of a communicator's
// start, comm/ucx/), and the ranks that read later held up the first messages of the others.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/rendezvous/store.h"

namespace gradex::comm {

// Collective over the `size` ranks: every rank has set its entry under key_of(its rank) already
// and passes it as `own`. Returns every rank's entry, by rank (`own` at `rank`). From 3 ranks on,
// rank 0 (which usually serves the store, so its gets cost no network round trip) reads the peers'
// entries and sets `combined_key` to all of them; the others read that one key. Below 3 ranks each
// reads its peers' entries. A store value that does not parse as the combined entries of `size`
// ranks: CorruptPayload naming the key. A rank that never set its entry: rank 0's TimeoutError
// names its key; the others' name it too where the store can tell (else the combined key).
std::vector<Bytes> gather_store_entries(Store& store, const std::function<std::string(int)>& key_of,
                                        const std::string& combined_key, int rank, int size,
                                        Bytes own, Millis timeout);

}  // namespace gradex::comm
