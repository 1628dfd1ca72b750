// Which interface HARP listens on: HARP_IFNAME, else NCCL_SOCKET_IFNAME read as NCCL reads it
// (prefixes, '^' to exclude, '=' for exact names), else the first interface up; and why.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/harp/core/interface_choice.h"

namespace tf_ext {
namespace harp {
namespace {

InterfaceAddress Up(const std::string& name, const char* address) {
  InterfaceAddress entry;
  entry.name = name;
  inet_pton(AF_INET, address, &entry.ipv4);
  entry.up = true;
  entry.loopback = name == "lo";
  return entry;
}

InterfaceAddress Down(const std::string& name, const char* address) {
  InterfaceAddress entry = Up(name, address);
  entry.up = false;
  return entry;
}

// A host as getifaddrs lists it: loopback first, a docker bridge, two NICs, an InfiniBand port.
const std::vector<InterfaceAddress>& Host() {
  static const std::vector<InterfaceAddress> host = {
      Up("lo", "127.0.0.1"),    Up("docker0", "172.17.0.1"), Up("eth0", "10.0.0.5"),
      Up("eth10", "10.1.0.5"),  Up("eth1", "10.2.0.5"),      Up("ib0", "192.168.7.5"),
      Down("eth2", "10.3.0.5"),
  };
  return host;
}

// The name chosen, or "error: <message>".
std::string Chosen(const std::string& harp_ifname, const std::string& nccl_socket_ifname,
                   const std::vector<InterfaceAddress>& interfaces = Host()) {
  InterfaceChoice choice;
  std::string error;
  if (!ChooseInterface(interfaces, harp_ifname, nccl_socket_ifname, &choice, &error)) {
    return "error: " + error;
  }
  return choice.name;
}

TEST(HarpInterfaceChoiceTest, NcclPrefixListsMatchNamePrefixes) {
  EXPECT_EQ(Chosen("", "eth"), "eth0");
  EXPECT_EQ(Chosen("", "ib,eth"), "eth0");  // the first interface admitted, not the first prefix
  EXPECT_EQ(Chosen("", "eth1"), "eth10");   // a prefix: eth10 starts with eth1
  EXPECT_EQ(Chosen("", "ib"), "ib0");
}

TEST(HarpInterfaceChoiceTest, EqualsMeansExactNames) {
  EXPECT_EQ(Chosen("", "=eth1"), "eth1");
  EXPECT_EQ(Chosen("", "=eth"),
            "error: NCCL_SOCKET_IFNAME='=eth' admits no interface with an "
            "IPv4 address (HARP_IFNAME is unset, so HARP follows it; this "
            "machine has: lo, docker0, eth0, eth10, eth1, ib0, eth2)");
  EXPECT_EQ(Chosen("", "=ib1,ib0"), "ib0");
}

TEST(HarpInterfaceChoiceTest, CaretExcludesTheListedPrefixesOrExactNames) {
  EXPECT_EQ(Chosen("", "^docker,lo"), "eth0");
  EXPECT_EQ(Chosen("", "^docker,lo,eth"), "ib0");
  EXPECT_EQ(Chosen("", "^=eth0,docker0,lo"), "eth10");
  EXPECT_EQ(Chosen("", "^=eth"), "docker0");  // excludes no name: docker0 is the first up NIC
}

TEST(HarpInterfaceChoiceTest, AdmittedInterfacesPreferUpAndNotLoopback) {
  EXPECT_EQ(Chosen("", "lo,eth0"), "eth0");  // loopback only when nothing else is admitted
  EXPECT_EQ(Chosen("", "lo"), "lo");
  EXPECT_EQ(Chosen("", "=eth2"), "eth2");  // down, but the only one named
  EXPECT_EQ(Chosen("", "^lo,docker,eth0,eth1,ib"), "eth2");
  EXPECT_EQ(Chosen("", "eth2,ib"), "ib0");  // up before down
}

TEST(HarpInterfaceChoiceTest, HarpIfnameWinsOverNcclSocketIfname) {
  EXPECT_EQ(Chosen("eth1", "ib"), "eth1");
  EXPECT_EQ(Chosen("10.2.0.5", "ib"), "eth1");
  EXPECT_EQ(Chosen("192.0.2.9", "ib"), "192.0.2.9");  // an address of no interface, bound as is
  EXPECT_EQ(Chosen("eth9", "eth").rfind("error: HARP_IFNAME='eth9' is invalid", 0), 0u);
}

TEST(HarpInterfaceChoiceTest, WithNeitherTheFirstInterfaceUpAndNotLoopbackElseLoopback) {
  EXPECT_EQ(Chosen("", ""), "docker0");
  EXPECT_EQ(Chosen("", "", {Up("lo", "127.0.0.1"), Down("eth0", "10.0.0.5")}), "lo");
  EXPECT_EQ(Chosen("", "", {}), "lo");
}

TEST(HarpInterfaceChoiceTest, TheReasonNamesTheSettingItsValueAndTheRule) {
  InterfaceChoice choice;
  std::string error;
  ASSERT_TRUE(ChooseInterface(Host(), "", "^docker,lo", &choice, &error)) << error;
  EXPECT_EQ(choice.name, "eth0");
  EXPECT_EQ(choice.ipv4, Host()[2].ipv4);
  EXPECT_EQ(choice.reason,
            "NCCL_SOCKET_IFNAME='^docker,lo' with HARP_IFNAME unset: of the interfaces it admits "
            "(eth0, eth10, eth1, ib0, eth2), the first that is up and not loopback");
  ASSERT_TRUE(ChooseInterface(Host(), "eth1", "ib", &choice, &error)) << error;
  EXPECT_EQ(choice.reason, "HARP_IFNAME='eth1'");
  ASSERT_TRUE(ChooseInterface(Host(), "", "", &choice, &error)) << error;
  EXPECT_EQ(choice.reason,
            "HARP_IFNAME and NCCL_SOCKET_IFNAME unset: the first interface that is up and not "
            "loopback");
}

TEST(HarpInterfaceChoiceTest, AdmitsFollowsNcclsSyntax) {
  EXPECT_TRUE(NcclSocketIfnameAdmits("", "eth0"));
  EXPECT_TRUE(NcclSocketIfnameAdmits("^", "eth0"));  // excludes nothing
  EXPECT_TRUE(NcclSocketIfnameAdmits("en,eth", "eth0"));
  EXPECT_FALSE(NcclSocketIfnameAdmits("en,eth", "ib0"));
  EXPECT_FALSE(NcclSocketIfnameAdmits("=eth", "eth0"));
  EXPECT_FALSE(NcclSocketIfnameAdmits("^eth", "eth0"));
  EXPECT_TRUE(NcclSocketIfnameAdmits("^=eth", "eth0"));
  EXPECT_FALSE(NcclSocketIfnameAdmits("^=eth0", "eth0"));
  EXPECT_TRUE(NcclSocketIfnameAdmits("eth,,ib", "ib0"));  // an empty item matches nothing
}

}  // namespace
}  // namespace harp
}  // namespace tf_ext
