#include "kernels/harp/core/interface_choice.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <sstream>

namespace tf_ext {
namespace harp HARP_HIDDEN {
namespace {

// The first of `candidates` that is up and not loopback, else the first up, else the first;
// `how` says which, for the reason.
const InterfaceAddress* Preferred(const std::vector<const InterfaceAddress*>& candidates,
                                  std::string* how) {
  for (const InterfaceAddress* candidate : candidates) {
    if (candidate->up && !candidate->loopback) {
      *how = "the first that is up and not loopback";
      return candidate;
    }
  }
  for (const InterfaceAddress* candidate : candidates) {
    if (candidate->up) {
      *how = "the first that is up (only loopback is)";
      return candidate;
    }
  }
  *how = "the first (none is up)";
  return candidates.empty() ? nullptr : candidates.front();
}

}  // namespace

bool NcclSocketIfnameAdmits(const std::string& spec, const std::string& name) {
  if (spec.empty()) return true;  // unset, as NCCL reads it
  size_t start = 0;
  const bool exclude = start < spec.size() && spec[start] == '^';
  if (exclude) ++start;
  const bool exact = start < spec.size() && spec[start] == '=';
  if (exact) ++start;
  bool listed = false;
  std::stringstream items(spec.substr(start));
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    if (exact ? name == item : name.compare(0, item.size(), item) == 0) {
      listed = true;
      break;
    }
  }
  return listed != exclude;
}

bool ChooseInterface(const std::vector<InterfaceAddress>& interfaces,
                     const std::string& harp_ifname, const std::string& nccl_socket_ifname,
                     InterfaceChoice* choice, std::string* error) {
  if (!harp_ifname.empty()) {
    in_addr address{};
    const bool is_address = inet_pton(AF_INET, harp_ifname.c_str(), &address) == 1;
    for (const InterfaceAddress& entry : interfaces) {
      if (is_address ? entry.ipv4 == address.s_addr : entry.name == harp_ifname) {
        *choice = {entry.name, entry.ipv4, "HARP_IFNAME='" + harp_ifname + "'"};
        return true;
      }
    }
    if (is_address) {  // an address of no interface listed: bound as given
      *choice = {harp_ifname, address.s_addr, "HARP_IFNAME='" + harp_ifname + "'"};
      return true;
    }
    *error = "HARP_IFNAME='" + harp_ifname +
             "' is invalid: no such interface with an IPv4 address (expected an interface name "
             "or an IPv4 address of this machine, or empty for NCCL_SOCKET_IFNAME's or the first "
             "interface that is up)";
    return false;
  }
  std::vector<const InterfaceAddress*> candidates;
  std::string how;
  if (!nccl_socket_ifname.empty()) {
    std::string admitted;
    for (const InterfaceAddress& entry : interfaces) {
      if (NcclSocketIfnameAdmits(nccl_socket_ifname, entry.name)) {
        candidates.push_back(&entry);
        admitted += (admitted.empty() ? "" : ", ") + entry.name;
      }
    }
    const InterfaceAddress* chosen = Preferred(candidates, &how);
    const std::string setting = "NCCL_SOCKET_IFNAME='" + nccl_socket_ifname + "'";
    if (chosen == nullptr) {
      std::string present;
      for (const InterfaceAddress& entry : interfaces) {
        present += (present.empty() ? "" : ", ") + entry.name;
      }
      *error = setting + " admits no interface with an IPv4 address (HARP_IFNAME is unset, so " +
               "HARP follows it; this machine has: " + present + ")";
      return false;
    }
    *choice = {chosen->name, chosen->ipv4,
               setting + " with HARP_IFNAME unset: of the interfaces it admits (" + admitted +
                   "), " + how};
    return true;
  }
  for (const InterfaceAddress& entry : interfaces) {
    if (entry.up && !entry.loopback) {
      *choice = {entry.name, entry.ipv4,
                 "HARP_IFNAME and NCCL_SOCKET_IFNAME unset: the first interface that is up and "
                 "not loopback"};
      return true;
    }
  }
  in_addr loopback{};
  inet_pton(AF_INET, "127.0.0.1", &loopback);
  *choice = {"lo", loopback.s_addr,
             "HARP_IFNAME and NCCL_SOCKET_IFNAME unset, and no interface but loopback is up"};
  return true;
}

std::vector<InterfaceAddress> ListInterfaces() {
  std::vector<InterfaceAddress> listed;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return listed;
  for (ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    InterfaceAddress address;
    address.name = entry->ifa_name;
    address.ipv4 = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr.s_addr;
    address.up = (entry->ifa_flags & IFF_UP) != 0;
    address.loopback = (entry->ifa_flags & IFF_LOOPBACK) != 0;
    listed.push_back(address);
  }
  freeifaddrs(interfaces);
  return listed;
}

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
