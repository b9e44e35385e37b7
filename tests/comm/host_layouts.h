// The host layouts the hierarchical collectives (comm/hierarchical.h) are tested on.
#pragma once

#include <string>
#include <vector>

namespace gradex::test {

// Host names by rank: even, interleaved, uneven, one host, one rank per host.
inline const std::vector<std::vector<std::string>>& host_layouts() {
  static const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"},            // 2 x 2
      {"a", "b", "c", "a", "b", "c"},  // 3 x 2, interleaved
      {"a", "a", "a", "b"},            // uneven: 3 + 1
      {"a", "b", "b", "c", "c", "c"},  // uneven: 1 + 2 + 3
      {"a", "a", "a"},                 // one host
      {"a", "b", "c"},                 // one rank per host
  };
  return layouts;
}

}  // namespace gradex::test
