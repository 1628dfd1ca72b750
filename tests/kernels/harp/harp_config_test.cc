// HARP_* parsing: defaults, valid values, and each invalid value rejected with its variable named.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "kernels/harp/core/config.h"

namespace tf_ext {
namespace harp {
namespace {

bool Parse(const std::map<std::string, std::string>& environment, Config* config,
           std::string* error) {
  return ParseConfig(
      [&](const char* name) -> const char* {
        auto found = environment.find(name);
        return found == environment.end() ? nullptr : found->second.c_str();
      },
      config, error);
}

TEST(HarpConfigTest, DefaultsAreTheDeclaredOnes) {
  Config config;
  std::string error;
  ASSERT_TRUE(Parse({}, &config, &error)) << error;
  EXPECT_EQ(config.streams_per_connection, 4);
  EXPECT_EQ(config.worker_threads, 2);
  EXPECT_TRUE(config.cpu_affinity.empty());
  EXPECT_EQ(config.chunk_bytes, 524288u);
  EXPECT_EQ(config.zerocopy_threshold, 0u);
  EXPECT_EQ(config.interface, "");
  EXPECT_EQ(config.timeout_ms, 30000);
  EXPECT_EQ(config.caller_connections, 1);
  // The description spells every default as the table of defaults does.
  std::string expected;
  for (const SettingDefault& setting : SettingDefaults()) {
    expected +=
        std::string(expected.empty() ? "" : " ") + setting.name + "=" + setting.default_value;
  }
  EXPECT_EQ(DescribeConfig(config), expected);
  EXPECT_EQ(SettingDefaults().size(), 8u);
}

TEST(HarpConfigTest, ValidValues) {
  Config config;
  std::string error;
  ASSERT_TRUE(Parse({{"HARP_NSTREAMS", "16"},
                     {"HARP_NTHREADS", "1"},
                     {"HARP_CPU_AFFINITY", "0,2,4-6"},
                     {"HARP_CHUNK_BYTES", "65536"},
                     {"HARP_ZEROCOPY_THRESHOLD", "1048576"},
                     {"HARP_IFNAME", "eth0"},
                     {"HARP_TIMEOUT_MS", "500"},
                     {"HARP_CALLER_CONNECTIONS", "0"}},
                    &config, &error))
      << error;
  EXPECT_EQ(config.streams_per_connection, 16);
  EXPECT_EQ(config.worker_threads, 1);
  EXPECT_EQ(config.cpu_affinity, (std::vector<int>{0, 2, 4, 5, 6}));
  EXPECT_EQ(config.chunk_bytes, 65536u);
  EXPECT_EQ(config.zerocopy_threshold, 1048576u);
  EXPECT_EQ(config.interface, "eth0");
  EXPECT_EQ(config.timeout_ms, 500);
  EXPECT_EQ(config.caller_connections, 0);
}

TEST(HarpConfigTest, InvalidValuesNameTheVariable) {
  const std::map<std::string, std::vector<std::string>> invalid = {
      {"HARP_NSTREAMS", {"0", "65", "-1", "four", "", " 4", "4x"}},
      {"HARP_NTHREADS", {"0", "1000", "1.5"}},
      {"HARP_CPU_AFFINITY", {"a", "1,", "3-1", "-2", "0,,1", "5000"}},
      {"HARP_CHUNK_BYTES", {"1", "4095", "99999999999", "64k"}},
      {"HARP_ZEROCOPY_THRESHOLD", {"-5", "big", "99999999999999999999"}},
      {"HARP_IFNAME", {"eth 0", std::string(65, 'x')}},
      {"HARP_TIMEOUT_MS", {"0", "99", "3600001", "1s"}},
      {"HARP_CALLER_CONNECTIONS", {"-1", "65", "one"}},
  };
  for (const auto& entry : invalid) {
    for (const std::string& value : entry.second) {
      Config config;
      std::string error;
      EXPECT_FALSE(Parse({{entry.first, value}}, &config, &error)) << entry.first << "=" << value;
      EXPECT_NE(error.find(entry.first + "='" + value + "' is invalid"), std::string::npos)
          << error;
    }
  }
}

TEST(HarpConfigTest, AFailedParseLeavesTheConfigUntouched) {
  Config config;
  config.streams_per_connection = 7;
  std::string error;
  EXPECT_FALSE(Parse({{"HARP_NTHREADS", "0"}}, &config, &error));
  EXPECT_EQ(config.streams_per_connection, 7);
}

}  // namespace
}  // namespace harp
}  // namespace tf_ext
