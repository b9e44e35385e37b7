// gradex-delayline: a userspace WAN between emulated hosts (network namespaces), for kernels
// without sch_netem. Creates a TUN device in each host's namespace, relays IPv4 packets between
// them with per-region rates, delays, drop-tail queues and random loss (link.h, relay.h), prints
// "ready <hosts>" once every device exists, then serves commands on stdin (relay.h) until "quit"
// or end of input. The devices vanish when it exits. bench/cluster/wan.py drives it: it creates the
// namespaces, then configures the devices' addresses, MTU and routes after "ready".
//
//   gradex-delayline --netns gxw-h0,gxw-h1 --subnet 198.19.0 --intra 1gbit,25ms
//                    [--regions 0,0,1,1 --inter 1gbit,25ms [--inter-pairs 0-2:1gbit,75ms;...]]
//                    [--dev wan0] [--queue-ms 10]
//                    [--mtu 65000] [--loss 0.001] [--seed 1]
//
// Host i's address is <subnet>.<i+1>. Exit status: 0 after quit/end of input, 2 on a usage error,
// 1 on any other failure (the message names what failed).
#include <arpa/inet.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "relay.h"

namespace gd = gradex::delayline;

namespace {

struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(item);
  return out;
}

gd::RelayOptions parse(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    static const char* known[] = {"--netns",       "--subnet",  "--intra", "--inter",
                                  "--inter-pairs", "--regions", "--dev",   "--queue-ms",
                                  "--mtu",         "--loss",    "--seed"};
    bool ok = false;
    for (const char* k : known)
      ok = ok || name == k;
    if (!ok) throw UsageError("unknown option '" + name + "'");
    if (i + 1 >= argc) throw UsageError(name + " needs a value");
    flags[name] = argv[i + 1];
  }
  for (const char* required : {"--netns", "--subnet", "--intra"}) {
    if (!flags.count(required)) throw UsageError(std::string(required) + " is required");
  }
  gd::RelayOptions options;
  options.netns = split(flags["--netns"]);
  const size_t hosts = options.netns.size();
  if (hosts < 2 || hosts > 250) throw UsageError("--netns must name 2 to 250 namespaces");
  for (size_t h = 0; h < hosts; ++h) {
    const std::string addr = flags["--subnet"] + "." + std::to_string(h + 1);
    in_addr parsed{};
    if (::inet_pton(AF_INET, addr.c_str(), &parsed) != 1) {
      throw UsageError("bad --subnet '" + flags["--subnet"] + "' (expected A.B.C, e.g. 198.19.0)");
    }
    options.addrs.push_back(ntohl(parsed.s_addr));
  }
  if (flags.count("--dev")) options.dev = flags["--dev"];
  auto& topo = options.topology;
  topo.intra = gd::parse_link(flags["--intra"]);
  if (flags.count("--inter")) topo.inter = gd::parse_link(flags["--inter"]);
  if (flags.count("--inter-pairs"))
    topo.inter_pairs = gd::parse_inter_pairs(flags["--inter-pairs"]);
  if (flags.count("--regions")) {
    for (const auto& r : split(flags["--regions"]))
      topo.region_of.push_back(std::stoi(r));
    if (topo.region_of.size() != hosts) throw UsageError("--regions must give one region per host");
  } else {
    topo.region_of.assign(hosts, 0);
  }
  if (flags.count("--queue-ms")) topo.queue_ms = std::stod(flags["--queue-ms"]);
  if (flags.count("--mtu")) topo.mtu = std::stoll(flags["--mtu"]);
  if (flags.count("--loss")) options.loss = std::stod(flags["--loss"]);
  if (flags.count("--seed")) options.seed = std::stoull(flags["--seed"]);
  if (topo.queue_ms <= 0) throw UsageError("--queue-ms must be > 0");
  if (topo.mtu < 576 || topo.mtu > 65535) throw UsageError("--mtu must be in [576, 65535]");
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  gd::RelayOptions options;
  try {
    options = parse(argc, argv);
  } catch (const std::exception& e) {  // UsageError, and std::stoi's and parse_link's complaints
    std::cerr << "gradex-delayline: " << e.what()
              << " (usage: see bench/cluster/delayline/main.cc)\n";
    return 2;
  }
  const size_t hosts = options.netns.size();
  try {
    gd::Relay relay(std::move(options));
    std::cout << "ready " << hosts << std::endl;
    relay.run(STDIN_FILENO, STDOUT_FILENO);
    std::cerr << "gradex-delayline: " << relay.stats_line() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gradex-delayline: " << e.what() << "\n";
    return 1;
  }
}
