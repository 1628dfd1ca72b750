// Which interface HARP listens on, from the machine's IPv4 interfaces and the settings: HARP_IFNAME
// (a name or an IPv4 address) when set, else NCCL_SOCKET_IFNAME as NCCL's socket transport reads
// it, else the first interface that is up and not loopback, else loopback. A pure function over
// a list (googletest feeds it made-up interfaces); ListInterfaces() reads the machine's.
//
// NCCL_SOCKET_IFNAME is a comma-separated list of name prefixes ("eth,ib"); a leading '^'
// excludes the listed names instead ("^docker,lo"), and a leading '=' (after any '^') makes them
// exact names ("=eth0", "^=docker0"). Of the interfaces it admits, HARP takes the first that is
// up and not loopback, else the first that is up, else the first.
#ifndef TF_EXT_KERNELS_HARP_CORE_INTERFACE_CHOICE_H_
#define TF_EXT_KERNELS_HARP_CORE_INTERFACE_CHOICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/harp/core/build_info.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

struct InterfaceAddress {
  std::string name;
  uint32_t ipv4 = 0;  // network byte order
  bool up = false;
  bool loopback = false;
};

struct InterfaceChoice {
  std::string name;
  uint32_t ipv4 = 0;   // network byte order
  std::string reason;  // which setting chose it and how, for the log
};

// Whether NCCL_SOCKET_IFNAME=`spec` admits the interface `name` (an empty spec admits all).
bool NcclSocketIfnameAdmits(const std::string& spec, const std::string& name);

// The interface to listen on (see the top of this file). False, with `error` naming the setting
// and its value, when the setting names no interface of `interfaces` (in getifaddrs order).
bool ChooseInterface(const std::vector<InterfaceAddress>& interfaces,
                     const std::string& harp_ifname, const std::string& nccl_socket_ifname,
                     InterfaceChoice* choice, std::string* error);

// The machine's interfaces with an IPv4 address, in getifaddrs order (one entry per address).
std::vector<InterfaceAddress> ListInterfaces();

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_INTERFACE_CHOICE_H_
