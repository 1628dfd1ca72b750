// HARP's own declarations of NCCL's plugin interface against the layout NCCL reads: sizes and
// every member's offset on x86-64/aarch64 Linux (LP64), derived by hand from NCCL's
// src/include/plugin/net/net_v6.h ... net_v12.h (pointers and size_t 8 bytes, int/float/enum 4,
// natural alignment). A wrong member order or type shows here by name.
#include "kernels/harp/core/nccl_net_abi.h"

#include <gtest/gtest.h>

#include <cstddef>

namespace {

#define EXPECT_OFFSET(type, member, offset) \
  EXPECT_EQ(offsetof(type, member), size_t{offset}) << #member

TEST(NcclNetAbiTest, ConstantsMatchNccl) {
  EXPECT_EQ(NCCL_NET_HANDLE_MAXSIZE, 128);
  EXPECT_EQ(NCCL_NET_MAX_REQUESTS, 32);
  EXPECT_EQ(NCCL_PTR_HOST, 1);
  EXPECT_EQ(NCCL_PTR_CUDA, 2);
  EXPECT_EQ(NCCL_PTR_DMABUF, 4);
  EXPECT_EQ(ncclSuccess, 0);
  EXPECT_EQ(ncclSystemError, 2);
  EXPECT_EQ(ncclInternalError, 3);
  EXPECT_EQ(ncclInvalidArgument, 4);
  EXPECT_EQ(ncclInvalidUsage, 5);
  EXPECT_EQ(ncclRemoteError, 6);
  EXPECT_EQ(ncclInProgress, 7);
  EXPECT_EQ(NCCL_LOG_WARN, 2);
  EXPECT_EQ(NCCL_LOG_INFO, 3);
  EXPECT_EQ(NCCL_NET, 0x10);
  EXPECT_EQ(NCCL_NET_TRAFFIC_CLASS_UNDEF, -1);
  EXPECT_EQ(NCCL_NET_ID_UNDEF, -1);
}

TEST(NcclNetAbiTest, PropertiesV6) {
  EXPECT_EQ(sizeof(ncclNetProperties_v6_t), 48u);
  EXPECT_OFFSET(ncclNetProperties_v6_t, name, 0);
  EXPECT_OFFSET(ncclNetProperties_v6_t, pciPath, 8);
  EXPECT_OFFSET(ncclNetProperties_v6_t, guid, 16);
  EXPECT_OFFSET(ncclNetProperties_v6_t, ptrSupport, 24);
  EXPECT_OFFSET(ncclNetProperties_v6_t, speed, 28);
  EXPECT_OFFSET(ncclNetProperties_v6_t, port, 32);
  EXPECT_OFFSET(ncclNetProperties_v6_t, latency, 36);
  EXPECT_OFFSET(ncclNetProperties_v6_t, maxComms, 40);
  EXPECT_OFFSET(ncclNetProperties_v6_t, maxRecvs, 44);
}

TEST(NcclNetAbiTest, PropertiesV7) {
  EXPECT_EQ(sizeof(ncclNetProperties_v7_t), 56u);
  EXPECT_OFFSET(ncclNetProperties_v7_t, ptrSupport, 24);
  EXPECT_OFFSET(ncclNetProperties_v7_t, speed, 28);
  EXPECT_OFFSET(ncclNetProperties_v7_t, maxRecvs, 44);
  EXPECT_OFFSET(ncclNetProperties_v7_t, netDeviceType, 48);
  EXPECT_OFFSET(ncclNetProperties_v7_t, netDeviceVersion, 52);
}

TEST(NcclNetAbiTest, PropertiesV8) {
  EXPECT_EQ(sizeof(ncclNetProperties_v8_t), 64u);
  EXPECT_OFFSET(ncclNetProperties_v8_t, ptrSupport, 24);
  EXPECT_OFFSET(ncclNetProperties_v8_t, regIsGlobal, 28);
  EXPECT_OFFSET(ncclNetProperties_v8_t, speed, 32);
  EXPECT_OFFSET(ncclNetProperties_v8_t, port, 36);
  EXPECT_OFFSET(ncclNetProperties_v8_t, latency, 40);
  EXPECT_OFFSET(ncclNetProperties_v8_t, maxComms, 44);
  EXPECT_OFFSET(ncclNetProperties_v8_t, maxRecvs, 48);
  EXPECT_OFFSET(ncclNetProperties_v8_t, netDeviceType, 52);
  EXPECT_OFFSET(ncclNetProperties_v8_t, netDeviceVersion, 56);
}

// The members every property struct from v9 on begins with, where v9 put them.
template <typename Properties>
void ExpectV9PropertiesHead() {
  EXPECT_OFFSET(Properties, ptrSupport, 24);
  EXPECT_OFFSET(Properties, regIsGlobal, 28);
  EXPECT_OFFSET(Properties, forceFlush, 32);
  EXPECT_OFFSET(Properties, speed, 36);
  EXPECT_OFFSET(Properties, port, 40);
  EXPECT_OFFSET(Properties, latency, 44);
  EXPECT_OFFSET(Properties, maxComms, 48);
  EXPECT_OFFSET(Properties, maxRecvs, 52);
  EXPECT_OFFSET(Properties, netDeviceType, 56);
  EXPECT_OFFSET(Properties, netDeviceVersion, 60);
  EXPECT_OFFSET(Properties, vProps, 64);
}

TEST(NcclNetAbiTest, PropertiesV9AndV10) {
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v9_t), 20u);
  EXPECT_EQ(sizeof(ncclNetProperties_v9_t), 104u);
  EXPECT_EQ(sizeof(ncclNetProperties_v10_t), 104u);
  ExpectV9PropertiesHead<ncclNetProperties_v10_t>();
  EXPECT_OFFSET(ncclNetProperties_v10_t, maxP2pBytes, 88);
  EXPECT_OFFSET(ncclNetProperties_v10_t, maxCollBytes, 96);
  EXPECT_EQ(sizeof(ncclNetCommConfig_v10_t), 4u);
}

TEST(NcclNetAbiTest, TableV6) {
  EXPECT_EQ(sizeof(ncclNet_v6_t), 136u);
  EXPECT_OFFSET(ncclNet_v6_t, name, 0);
  EXPECT_OFFSET(ncclNet_v6_t, init, 8);
  EXPECT_OFFSET(ncclNet_v6_t, devices, 16);
  EXPECT_OFFSET(ncclNet_v6_t, getProperties, 24);
  EXPECT_OFFSET(ncclNet_v6_t, listen, 32);
  EXPECT_OFFSET(ncclNet_v6_t, connect, 40);
  EXPECT_OFFSET(ncclNet_v6_t, accept, 48);
  EXPECT_OFFSET(ncclNet_v6_t, regMr, 56);
  EXPECT_OFFSET(ncclNet_v6_t, regMrDmaBuf, 64);
  EXPECT_OFFSET(ncclNet_v6_t, deregMr, 72);
  EXPECT_OFFSET(ncclNet_v6_t, isend, 80);
  EXPECT_OFFSET(ncclNet_v6_t, irecv, 88);
  EXPECT_OFFSET(ncclNet_v6_t, iflush, 96);
  EXPECT_OFFSET(ncclNet_v6_t, test, 104);
  EXPECT_OFFSET(ncclNet_v6_t, closeSend, 112);
  EXPECT_OFFSET(ncclNet_v6_t, closeRecv, 120);
  EXPECT_OFFSET(ncclNet_v6_t, closeListen, 128);
}

// v7 and v8 share the member list (v8 changes regMr's size type).
template <typename Table>
void ExpectV7Layout() {
  EXPECT_OFFSET(Table, init, 8);
  EXPECT_OFFSET(Table, getProperties, 24);
  EXPECT_OFFSET(Table, connect, 40);
  EXPECT_OFFSET(Table, accept, 48);
  EXPECT_OFFSET(Table, regMr, 56);
  EXPECT_OFFSET(Table, isend, 80);
  EXPECT_OFFSET(Table, irecv, 88);
  EXPECT_OFFSET(Table, test, 104);
  EXPECT_OFFSET(Table, closeListen, 128);
  EXPECT_OFFSET(Table, getDeviceMr, 136);
  EXPECT_OFFSET(Table, irecvConsumed, 144);
}

TEST(NcclNetAbiTest, TablesV7AndV8) {
  EXPECT_EQ(sizeof(ncclNet_v7_t), 152u);
  EXPECT_EQ(sizeof(ncclNet_v8_t), 152u);
  ExpectV7Layout<ncclNet_v7_t>();
  ExpectV7Layout<ncclNet_v8_t>();
}

TEST(NcclNetAbiTest, TablesV9AndV10) {
  ExpectV7Layout<ncclNet_v9_t>();
  EXPECT_EQ(sizeof(ncclNet_v9_t), 160u);
  EXPECT_OFFSET(ncclNet_v9_t, makeVDevice, 152);
  EXPECT_EQ(sizeof(ncclNet_v10_t), 160u);
  EXPECT_OFFSET(ncclNet_v10_t, init, 8);
  EXPECT_OFFSET(ncclNet_v10_t, connect, 40);
  EXPECT_OFFSET(ncclNet_v10_t, isend, 80);
  EXPECT_OFFSET(ncclNet_v10_t, irecv, 88);
  EXPECT_OFFSET(ncclNet_v10_t, irecvConsumed, 144);
  EXPECT_OFFSET(ncclNet_v10_t, makeVDevice, 152);
}

TEST(NcclNetAbiTest, PropertiesV11AndV12) {
  EXPECT_EQ(sizeof(ncclNetCommConfig_v11_t), 4u);
  EXPECT_EQ(sizeof(ncclNetCommConfig_v12_t), 4u);
  EXPECT_EQ(sizeof(ncclNetProperties_v11_t), 112u);
  ExpectV9PropertiesHead<ncclNetProperties_v11_t>();
  EXPECT_OFFSET(ncclNetProperties_v11_t, maxP2pBytes, 88);
  EXPECT_OFFSET(ncclNetProperties_v11_t, maxCollBytes, 96);
  EXPECT_OFFSET(ncclNetProperties_v11_t, maxMultiRequestSize, 104);
  // v12's virtual-device slots double: what follows them moves.
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v12_t), 36u);
  EXPECT_EQ(sizeof(ncclNetProperties_v12_t), 128u);
  ExpectV9PropertiesHead<ncclNetProperties_v12_t>();
  EXPECT_OFFSET(ncclNetProperties_v12_t, maxP2pBytes, 104);
  EXPECT_OFFSET(ncclNetProperties_v12_t, maxCollBytes, 112);
  EXPECT_OFFSET(ncclNetProperties_v12_t, maxMultiRequestSize, 120);
  EXPECT_OFFSET(ncclNetProperties_v12_t, railId, 124);
  EXPECT_OFFSET(ncclNetProperties_v12_t, planeId, 126);
  EXPECT_EQ(sizeof(ncclNetAttr_v11_t), 44u);
  EXPECT_OFFSET(ncclNetAttr_v11_t, recvCommAttr, 16);
  EXPECT_OFFSET(ncclNetAttr_v11_t, op, 32);
  EXPECT_OFFSET(ncclNetAttr_v11_t, proto, 40);
}

// v11 and v12 share the member list (their property types differ).
template <typename Table>
void ExpectV11Layout() {
  ExpectV7Layout<Table>();  // v11 changed arguments, not the places of v7's members
  EXPECT_EQ(sizeof(Table), 176u);
  EXPECT_OFFSET(Table, listen, 32);
  EXPECT_OFFSET(Table, makeVDevice, 152);
  EXPECT_OFFSET(Table, finalize, 160);
  EXPECT_OFFSET(Table, setNetAttr, 168);
}

TEST(NcclNetAbiTest, TablesV11AndV12) {
  ExpectV11Layout<ncclNet_v11_t>();
  ExpectV11Layout<ncclNet_v12_t>();
}

}  // namespace
