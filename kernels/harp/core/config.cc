#include "kernels/harp/core/config.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace tf_ext {
namespace harp HARP_HIDDEN {
namespace {

// Whole-string unsigned decimal; no sign, no spaces, no overflow.
bool ParseUnsigned(const std::string& text, unsigned long long* value) {
  if (text.empty() || text.size() > 19) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  errno = 0;
  *value = std::strtoull(text.c_str(), nullptr, 10);
  return errno == 0;
}

std::string Invalid(const char* name, const std::string& value, const std::string& why) {
  return std::string(name) + "='" + value + "' is invalid: " + why;
}

bool ParseRange(const char* name, const std::string& value, unsigned long long minimum,
                unsigned long long maximum, unsigned long long* out, std::string* error) {
  if (!ParseUnsigned(value, out) || *out < minimum || *out > maximum) {
    *error = Invalid(name, value,
                     "expected an integer in [" + std::to_string(minimum) + ", " +
                         std::to_string(maximum) + "]");
    return false;
  }
  return true;
}

// "0,2,4-7": CPU numbers and inclusive ranges.
bool ParseCpuList(const char* name, const std::string& value, std::vector<int>* cpus,
                  std::string* error) {
  cpus->clear();
  if (value.empty()) return true;
  std::stringstream items(value);
  std::string item;
  while (std::getline(items, item, ',')) {
    size_t dash = item.find('-');
    unsigned long long first = 0, last = 0;
    bool ok = dash == std::string::npos ? ParseUnsigned(item, &first) && (last = first, true)
                                        : ParseUnsigned(item.substr(0, dash), &first) &&
                                              ParseUnsigned(item.substr(dash + 1), &last);
    if (!ok || first > last || last >= 4096) {
      *error = Invalid(name, value, "expected CPU numbers below 4096 and ranges, e.g. 0,2,4-7");
      return false;
    }
    for (unsigned long long cpu = first; cpu <= last; ++cpu) cpus->push_back(static_cast<int>(cpu));
  }
  if (value.back() == ',') {
    *error = Invalid(name, value, "expected CPU numbers below 4096 and ranges, e.g. 0,2,4-7");
    return false;
  }
  return true;
}

}  // namespace

const std::vector<SettingDefault>& SettingDefaults() {
  static const std::vector<SettingDefault> defaults = {
      {"HARP_NSTREAMS", "4"},         {"HARP_NTHREADS", "2"},           {"HARP_CPU_AFFINITY", ""},
      {"HARP_CHUNK_BYTES", "524288"}, {"HARP_ZEROCOPY_THRESHOLD", "0"}, {"HARP_IFNAME", ""},
      {"HARP_TIMEOUT_MS", "30000"},   {"HARP_CALLER_CONNECTIONS", "1"},
  };
  return defaults;
}

bool ParseConfig(const std::function<const char*(const char*)>& lookup, Config* config,
                 std::string* error) {
  auto value_of = [&](const char* name) {
    const char* value = lookup ? lookup(name) : nullptr;
    if (value != nullptr) return std::string(value);
    for (const SettingDefault& setting : SettingDefaults()) {
      if (std::string(setting.name) == name) return std::string(setting.default_value);
    }
    return std::string();
  };
  Config parsed;
  unsigned long long number = 0;
  if (!ParseRange("HARP_NSTREAMS", value_of("HARP_NSTREAMS"), 1, kMaxStreams, &number, error)) {
    return false;
  }
  parsed.streams_per_connection = static_cast<int>(number);
  if (!ParseRange("HARP_NTHREADS", value_of("HARP_NTHREADS"), 1, kMaxWorkerThreads, &number,
                  error)) {
    return false;
  }
  parsed.worker_threads = static_cast<int>(number);
  if (!ParseCpuList("HARP_CPU_AFFINITY", value_of("HARP_CPU_AFFINITY"), &parsed.cpu_affinity,
                    error)) {
    return false;
  }
  if (!ParseRange("HARP_CHUNK_BYTES", value_of("HARP_CHUNK_BYTES"), kMinChunkBytes, kMaxChunkBytes,
                  &number, error)) {
    return false;
  }
  parsed.chunk_bytes = number;
  if (!ParseRange("HARP_ZEROCOPY_THRESHOLD", value_of("HARP_ZEROCOPY_THRESHOLD"), 0, (1ull << 62),
                  &number, error)) {
    return false;
  }
  parsed.zerocopy_threshold = number;
  parsed.interface = value_of("HARP_IFNAME");
  if (parsed.interface.size() > 64 || parsed.interface.find(' ') != std::string::npos) {
    *error = Invalid("HARP_IFNAME", parsed.interface,
                     "expected an interface name or an IPv4 address, or empty (auto)");
    return false;
  }
  // NCCL's own setting: NCCL accepts any value, so HARP does too (interface_choice.h reads it).
  const char* nccl_socket_ifname = lookup ? lookup("NCCL_SOCKET_IFNAME") : nullptr;
  parsed.nccl_socket_ifname = nccl_socket_ifname ? nccl_socket_ifname : "";
  if (!ParseRange("HARP_TIMEOUT_MS", value_of("HARP_TIMEOUT_MS"), 100, 3600 * 1000, &number,
                  error)) {
    return false;
  }
  parsed.timeout_ms = static_cast<int>(number);
  if (!ParseRange("HARP_CALLER_CONNECTIONS", value_of("HARP_CALLER_CONNECTIONS"), 0,
                  kMaxCallerConnections, &number, error)) {
    return false;
  }
  parsed.caller_connections = static_cast<int>(number);
  *config = parsed;
  return true;
}

bool ConfigFromEnvironment(Config* config, std::string* error) {
  return ParseConfig([](const char* name) { return std::getenv(name); }, config, error);
}

std::string DescribeConfig(const Config& config) {
  std::string cpus;
  for (size_t i = 0; i < config.cpu_affinity.size(); ++i) {
    cpus += (i ? "," : "") + std::to_string(config.cpu_affinity[i]);
  }
  return "HARP_NSTREAMS=" + std::to_string(config.streams_per_connection) +
         " HARP_NTHREADS=" + std::to_string(config.worker_threads) + " HARP_CPU_AFFINITY=" + cpus +
         " HARP_CHUNK_BYTES=" + std::to_string(config.chunk_bytes) +
         " HARP_ZEROCOPY_THRESHOLD=" + std::to_string(config.zerocopy_threshold) +
         " HARP_IFNAME=" + config.interface +
         " HARP_TIMEOUT_MS=" + std::to_string(config.timeout_ms) +
         " HARP_CALLER_CONNECTIONS=" + std::to_string(config.caller_connections);
}

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
