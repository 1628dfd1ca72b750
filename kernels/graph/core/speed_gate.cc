#include "kernels/graph/core/speed_gate.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <utility>

#include "kernels/graph/core/compile_log.h"

namespace tf_ext {
namespace graph {
namespace {

double Median(std::vector<double> values) {
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  return (upper + *std::max_element(values.begin(), values.begin() + middle)) / 2;
}

std::atomic<bool> speed_gate_enabled{false};

}  // namespace

SpeedGate::SpeedGate(std::string clusters, SpeedGateOptions options)
    : clusters_(std::move(clusters)), options_(options) {}

bool SpeedGate::Begin(int64_t step_id, int64_t elements, int64_t now_ns, SpeedVerdict* verdict,
                      bool* finished) {
  std::lock_guard<std::mutex> lock(mutex_);
  *finished = false;
  if (!in_step_ || step_id != step_id_) {  // the first cluster of a new step
    *finished = in_step_ && CloseStep(now_ns, verdict);
    ++steps_;
    in_step_ = true;
    step_id_ = step_id;
    step_elements_ = 0;
    step_start_ns_ = now_ns;
    step_mixed_ = false;
    step_counted_ready_ = false;
    if (phase_ == Phase::kHolding && verdict_ == 1 && steps_ >= next_check_step_) {
      phase_ = Phase::kChecking;
    }
    step_timed_ = phase_ == Phase::kChecking;
    if (phase_ == Phase::kChecking) {
      // Alternating: the way with fewer samples runs (compiled on a tie).
      step_compiled_ = compiled_.size() <= uncompiled_.size();
    } else {
      step_compiled_ = phase_ == Phase::kWarming || verdict_ == 1;
    }
  }
  step_elements_ += elements;
  return step_compiled_;
}

void SpeedGate::Ready(int64_t step_id, bool ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!in_step_ || step_id != step_id_) return;  // a step already closed
  if (!ready) {
    step_mixed_ = true;
  } else if (!step_counted_ready_ && phase_ == Phase::kWarming) {
    step_counted_ready_ = true;
    if (++ready_steps_ > options_.settle) phase_ = Phase::kChecking;
  }
}

bool SpeedGate::CloseStep(int64_t now_ns, SpeedVerdict* verdict) {
  if (!step_timed_ || step_elements_ <= 0 || phase_ != Phase::kChecking) return false;
  if (step_compiled_ && step_mixed_) return false;  // it ran partly uncompiled
  const double per_element = static_cast<double>(now_ns - step_start_ns_) / step_elements_;
  (step_compiled_ ? compiled_ : uncompiled_).push_back(per_element);
  const size_t wanted = static_cast<size_t>(options_.samples);
  if (compiled_.size() < wanted || uncompiled_.size() < wanted) return false;
  verdict->clusters = clusters_;
  verdict->compiled_ns = Median(compiled_);
  verdict->uncompiled_ns = Median(uncompiled_);
  verdict->run_compiled = verdict->compiled_ns <= verdict->uncompiled_ns * (1 + options_.margin);
  verdict_ = verdict->run_compiled ? 1 : 0;
  compiled_.clear();
  uncompiled_.clear();
  phase_ = Phase::kHolding;
  next_check_step_ = steps_ + options_.recheck_every;
  return true;
}

int SpeedGate::Verdict() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdict_;
}

SpeedGate* SpeedGates::Get(const std::string& key, const std::string& clusters) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<SpeedGate>& gate = gates_[key];
  if (gate == nullptr) gate = std::make_unique<SpeedGate>(clusters, SpeedGateOptions());
  return gate.get();
}

void SpeedGates::Record(SpeedVerdict* verdict) {
  std::lock_guard<std::mutex> lock(mutex_);
  verdict->sequence = ++count_;
  if (log_.size() >= kLogCapacity) log_.erase(log_.begin());
  log_.push_back(*verdict);
}

int64_t SpeedGates::Count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

std::string SpeedGates::FormatAfter(int64_t after) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream text;
  for (const SpeedVerdict& verdict : log_) {
    if (verdict.sequence <= after) continue;
    std::string clusters = verdict.clusters;
    std::replace_if(
        clusters.begin(), clusters.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
    text << verdict.sequence << '\t' << clusters << '\t' << (verdict.run_compiled ? 1 : 0) << '\t'
         << verdict.compiled_ns << '\t' << verdict.uncompiled_ns << '\n';
  }
  return text.str();
}

SpeedGates& ProcessSpeedGates() {
  static SpeedGates* gates = new SpeedGates();  // never destroyed: kernels may run at exit
  return *gates;
}

bool SpeedGateEnabled() { return speed_gate_enabled.load(); }
void SetSpeedGateEnabled(bool enabled) { speed_gate_enabled.store(enabled); }

}  // namespace graph
}  // namespace tf_ext

extern "C" int TfExtJitSetSpeedGate(int enable) {
  const int previous = tf_ext::graph::SpeedGateEnabled() ? 1 : 0;
  if (enable >= 0) tf_ext::graph::SetSpeedGateEnabled(enable > 0);
  return previous;
}

extern "C" int64_t TfExtJitSpeedVerdictCount(void) {
  return tf_ext::graph::ProcessSpeedGates().Count();
}

extern "C" int64_t TfExtJitSpeedVerdicts(int64_t after, char* buffer, int64_t capacity) {
  return tf_ext::graph::CopyText(tf_ext::graph::ProcessSpeedGates().FormatAfter(after), buffer,
                                 capacity);
}
