#include "kernels/jit/core/compile_log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace tf_ext {
namespace jit {
namespace {

// Fields are tab-separated and events newline-separated: a name must hold neither.
std::string Sanitized(const std::string& name) {
  std::string clean = name;
  std::replace_if(
      clean.begin(), clean.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return clean;
}

double SecondsSinceEpoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::atomic<int> listener_state{static_cast<int>(ListenerState::kNotRegistered)};
std::atomic<AsyncCompilationHook> async_compilation_hook{nullptr};

}  // namespace

CompileLog::CompileLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

int64_t CompileLog::Record(const std::string& cluster, const std::string& device,
                           int64_t compile_count, int64_t compile_time_us,
                           int64_t cumulative_compile_time_us) {
  CompileEvent event;
  event.time = SecondsSinceEpoch();
  event.cluster = Sanitized(cluster);
  event.device = Sanitized(device);
  event.compile_count = compile_count;
  event.compile_time_us = compile_time_us;
  event.cumulative_compile_time_us = cumulative_compile_time_us;
  std::lock_guard<std::mutex> lock(mutex_);
  event.sequence = ++count_;
  kept_.push_back(std::move(event));
  if (kept_.size() > capacity_) kept_.pop_front();
  return count_;
}

int64_t CompileLog::Count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

std::vector<CompileEvent> CompileLog::EventsAfter(int64_t after_sequence) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (kept_.empty() || after_sequence >= count_) return {};
  // Sequence numbers are consecutive, so the first event wanted is found by arithmetic.
  const int64_t first_kept = kept_.front().sequence;
  const int64_t skip = std::max<int64_t>(after_sequence - first_kept + 1, 0);
  return std::vector<CompileEvent>(kept_.begin() + skip, kept_.end());
}

std::string CompileLog::FormatAfter(int64_t after_sequence) const {
  std::string text;
  char numbers[160];
  for (const CompileEvent& event : EventsAfter(after_sequence)) {
    std::snprintf(numbers, sizeof(numbers), "%lld\t%.6f\t", static_cast<long long>(event.sequence),
                  event.time);
    text += numbers;
    text += event.cluster;
    text += '\t';
    text += event.device;
    std::snprintf(numbers, sizeof(numbers), "\t%lld\t%lld\t%lld\n",
                  static_cast<long long>(event.compile_count),
                  static_cast<long long>(event.compile_time_us),
                  static_cast<long long>(event.cumulative_compile_time_us));
    text += numbers;
  }
  return text;
}

CompileLog& ProcessCompileLog() {
  // Never destroyed: TensorFlow may still report a compilation while the process exits.
  static CompileLog* log = new CompileLog(CompileLog::kProcessCapacity);
  return *log;
}

ListenerState GetListenerState() { return static_cast<ListenerState>(listener_state.load()); }

void SetListenerState(ListenerState state) { listener_state.store(static_cast<int>(state)); }

void SetAsyncCompilationHook(AsyncCompilationHook hook) { async_compilation_hook.store(hook); }

int64_t CopyText(const std::string& text, char* buffer, int64_t capacity) {
  const int64_t needed = static_cast<int64_t>(text.size());
  if (buffer == nullptr || capacity <= 0) return needed;
  if (needed >= capacity) {
    buffer[0] = '\0';
    return needed;
  }
  std::memcpy(buffer, text.data(), text.size());
  buffer[needed] = '\0';
  return needed;
}

}  // namespace jit
}  // namespace tf_ext

extern "C" int64_t TfExtJitCompileEventCount(void) {
  return tf_ext::jit::ProcessCompileLog().Count();
}

extern "C" int64_t TfExtJitCompileLog(int64_t after_sequence, char* buffer, int64_t capacity) {
  return tf_ext::jit::CopyText(tf_ext::jit::ProcessCompileLog().FormatAfter(after_sequence), buffer,
                               capacity);
}

extern "C" int TfExtJitListenerState(void) {
  return static_cast<int>(tf_ext::jit::GetListenerState());
}

extern "C" int TfExtJitSetAsyncCompilation(int enable) {
  const tf_ext::jit::AsyncCompilationHook hook = tf_ext::jit::async_compilation_hook.load();
  return hook == nullptr ? -1 : hook(enable);
}
