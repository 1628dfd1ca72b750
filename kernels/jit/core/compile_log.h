// The XLA compilations of this process, as TensorFlow reports them to its activity listeners
// (kernels/jit/xla_compile_listener.cc records them here), and the switch for TensorFlow's
// asynchronous XLA compilation. TensorFlow-free: the TensorFlow side installs what needs
// TensorFlow (the listener's state, the switch's hook); tf_ext reads both through ctypes.
#ifndef TF_EXT_KERNELS_JIT_CORE_COMPILE_LOG_H_
#define TF_EXT_KERNELS_JIT_CORE_COMPILE_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace tf_ext {
namespace jit {

struct CompileEvent {
  int64_t sequence = 0;         // 1 for the first compilation recorded, then 2, 3, ...
  double time = 0;              // when it was recorded: seconds since the epoch
  std::string cluster;          // the XLA cluster (a tf.function's or a Session's cluster name)
  std::string device;           // the device type, where known; empty otherwise
  int64_t compile_count = 0;    // how often this cluster has been compiled, this time included
  int64_t compile_time_us = 0;  // this compilation
  int64_t cumulative_compile_time_us = 0;  // every compilation of this cluster so far
};

// Thread-safe: TensorFlow compiles on many threads. Keeps the newest `capacity` events only (a
// long-running process compiles without end when shapes keep changing), but counts them all.
class CompileLog {
 public:
  static constexpr size_t kProcessCapacity = 4096;

  explicit CompileLog(size_t capacity);

  // Records one compilation, stamped with the current time; returns its sequence number.
  int64_t Record(const std::string& cluster, const std::string& device, int64_t compile_count,
                 int64_t compile_time_us, int64_t cumulative_compile_time_us);
  // Every event recorded so far, kept or not.
  int64_t Count() const;
  // The kept events with a sequence number above `after_sequence`, oldest first.
  std::vector<CompileEvent> EventsAfter(int64_t after_sequence) const;
  // The same events as text: one line per event, its fields tab-separated in CompileEvent's order,
  // tabs and line breaks inside names replaced by spaces.
  std::string FormatAfter(int64_t after_sequence) const;

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  int64_t count_ = 0;
  std::deque<CompileEvent> kept_;  // ascending sequence numbers, the last is count_
};

// The log of this process, which the listener fills.
CompileLog& ProcessCompileLog();

// Whether TensorFlow's activity listener is registered (TfExtJitListenerState's values).
enum class ListenerState : int { kUnavailable = -1, kNotRegistered = 0, kRegistered = 1 };
ListenerState GetListenerState();
void SetListenerState(ListenerState state);

// Sets TensorFlow's asynchronous XLA compilation (on for enable > 0, off for 0, unchanged for a
// negative value) and returns its previous value (0 or 1). Installed by the TensorFlow side when it
// can reach TensorFlow's flags; without a hook TfExtJitSetAsyncCompilation reports -1.
using AsyncCompilationHook = int (*)(int enable);
void SetAsyncCompilationHook(AsyncCompilationHook hook);

// Copies `text` NUL-terminated into buffer[0..capacity) for a ctypes caller and returns its length
// without the NUL; when that is >= capacity only an empty string is written (the caller retries
// with a larger buffer).
int64_t CopyText(const std::string& text, char* buffer, int64_t capacity);

}  // namespace jit
}  // namespace tf_ext

// For tf_ext (through ctypes). Every compilation recorded so far, kept or not.
extern "C" int64_t TfExtJitCompileEventCount(void);
// Writes the kept events with a sequence number above `after_sequence` as CompileLog::FormatAfter's
// text, NUL-terminated, into buffer[0..capacity). Returns the text's length without the NUL: when
// that is >= capacity nothing was written but an empty string (buffer[0] = NUL, if capacity > 0);
// retry with a larger buffer. Each line: sequence, time, cluster, device, compile_count,
// compile_time_us, cumulative_compile_time_us.
extern "C" int64_t TfExtJitCompileLog(int64_t after_sequence, char* buffer, int64_t capacity);
// 1 when the listener is registered with TensorFlow, 0 when not (yet), -1 when it cannot be.
extern "C" int TfExtJitListenerState(void);
// Turns TensorFlow's asynchronous XLA compilation on (enable > 0) or off (0), or leaves it (< 0);
// returns the previous value (0 or 1), or -1 when TensorFlow's flags cannot be reached.
extern "C" int TfExtJitSetAsyncCompilation(int enable);

#endif  // TF_EXT_KERNELS_JIT_CORE_COMPILE_LOG_H_
