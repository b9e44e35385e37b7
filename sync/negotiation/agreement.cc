#include "sync/negotiation/agreement.h"

#include <algorithm>
#include <map>

#include "base/error.h"
#include "base/log.h"
#include "comm/collectives.h"
#include "compress/wire/codec.h"
#include "sync/negotiation/negotiation_codec.h"

namespace gradex::sync::agreement {
namespace {

// Bumped when the digest's lines change meaning (a new entry alone needs no bump: a name missing
// on one side is reported as a difference).
constexpr int kDigestFormat = 1;
constexpr const char* kFormatKey = "gradex.digest_format";
// A value a rank's digest does not hold (another build's variable list).
constexpr const char* kMissing = "<not declared>";

const char* scope_name(Scope scope) {
  return scope == Scope::kEngine ? "engine" : "DiLoCo optimizer";
}

config::Agreement agreement_of(Scope scope) {
  return scope == Scope::kEngine ? config::Agreement::kEngine : config::Agreement::kOuter;
}

// name -> value, in digest order; false when the text is not a digest.
bool parse(const std::string& text, std::vector<std::pair<std::string, std::string>>& out) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    if (end == std::string::npos) return false;
    const size_t eq = text.find('=', at);
    if (eq == std::string::npos || eq > end || eq == at) return false;
    out.emplace_back(text.substr(at, eq - at), text.substr(eq + 1, end - eq - 1));
    at = end + 1;
  }
  return !out.empty() && out.front().first == kFormatKey;
}

}  // namespace

std::string digest(const config::Config& config, Scope scope, uint32_t api_version) {
  std::string d;
  auto line = [&d](const std::string& name, const std::string& value) {
    d += name + "=" + value + "\n";
  };
  line(kFormatKey, std::to_string(kDigestFormat));
  line("gradex.api_version", std::to_string(api_version));
  line("gradex.wire_version", std::to_string(compress::wire::kVersion));
  line("gradex.negotiation_version", std::to_string(kNegotiationVersion));
  for (const config::VarSpec& s : config::registry()) {
    if (!config::agrees_in(s.agree, agreement_of(scope))) continue;
    std::string value = config.canonical_text(s.name);
    // Values are one line: a newline inside a string value must not end the entry.
    for (char& c : value)
      if (c == '\n' || c == '\r') c = ' ';
    line(s.name, value);
  }
  return d;
}

std::string compare(const std::vector<std::string>& digests, Scope scope) {
  bool all_equal = true;
  for (const std::string& d : digests)
    all_equal = all_equal && d == digests.front();
  if (all_equal) return "";

  // Entry names in first-seen order, and every rank's value of each.
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::string>> values;
  const size_t world = digests.size();
  for (size_t r = 0; r < world; ++r) {
    std::vector<std::pair<std::string, std::string>> entries;
    if (!parse(digests[r], entries))
      entries = {{kFormatKey, "<unreadable: " + std::to_string(digests[r].size()) + " bytes>"}};
    for (const auto& [name, value] : entries) {
      auto [it, inserted] = values.try_emplace(name, world, kMissing);
      if (inserted) names.push_back(name);
      it->second[r] = value;
    }
  }
  std::string message;
  for (const std::string& name : names) {
    const std::vector<std::string>& v = values[name];
    // Values in order of first appearance, each with its ranks.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (size_t r = 0; r < world; ++r) {
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const auto& group) { return group.first == v[r]; });
      if (g == groups.end()) {
        groups.push_back({v[r], {}});
        g = groups.end() - 1;
      }
      g->second.push_back(static_cast<int>(r));
    }
    if (groups.size() < 2) continue;
    message += message.empty() ? "" : "; ";
    message += name + ":";
    for (size_t i = 0; i < groups.size(); ++i)
      message += std::string(i ? "," : "") + " '" + groups[i].first + "' on ranks " +
                 rank_list(groups[i].second);
  }
  return std::string("ranks disagree on options that must be equal on every rank of the ") +
         scope_name(scope) +
         " (docs/configuration.md, \"Options every rank must share\"): " + message;
}

void require_agreement(std::unique_ptr<comm::Communicator>& comm, const config::Config& config,
                       Scope scope, uint32_t api_version) {
  if (comm->size() == 1) return;
  const std::string mine = digest(config, scope, api_version);
  std::vector<comm::Bytes> all = comm::allgatherv(*comm, mine.data(), mine.size());
  std::vector<std::string> digests;
  digests.reserve(all.size());
  for (const comm::Bytes& b : all)
    digests.emplace_back(b.begin(), b.end());
  const std::string difference = compare(digests, scope);
  if (difference.empty()) return;
  GX_LOG(kError) << difference;
  // Every rank found the same difference: closing normally (the communicator's goodbye barrier)
  // lets every rank receive every digest before any endpoint closes.
  comm.reset();
  throw ConfigError(difference);
}

}  // namespace gradex::sync::agreement
