#include "kernels/jit/core/speed_gate.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <utility>

#include "kernels/jit/core/compile_log.h"

namespace tf_ext {
namespace jit {
namespace {

double Median(std::vector<double> values) {
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  return (upper + *std::max_element(values.begin(), values.begin() + middle)) / 2;
}

// A way's step time as a fixed cost per step plus a cost per element.
struct Line {
  double fixed_ns = 0;
  double per_element_ns = 0;
  double At(double elements) const { return fixed_ns + per_element_ns * elements; }
};

// The Theil-Sen line of `steps` (the median of the pairwise slopes, then the median intercept:
// one stalled step cannot move it), both parts at least 0. False where the steps' elements span
// less than a factor 1.5: there is no slope to fit.
bool FitLine(const std::vector<SpeedGate::TimedStep>& steps, Line* line) {
  double low = steps[0].elements, high = low;
  for (const auto& step : steps) {
    low = std::min(low, step.elements);
    high = std::max(high, step.elements);
  }
  if (low * 1.5 > high) return false;
  std::vector<double> slopes;
  for (size_t i = 0; i < steps.size(); ++i) {
    for (size_t j = i + 1; j < steps.size(); ++j) {
      if (steps[j].elements == steps[i].elements) continue;
      slopes.push_back((steps[j].ns - steps[i].ns) / (steps[j].elements - steps[i].elements));
    }
  }
  line->per_element_ns = std::max(0.0, Median(slopes));
  std::vector<double> intercepts;
  for (const auto& step : steps)
    intercepts.push_back(step.ns - line->per_element_ns * step.elements);
  line->fixed_ns = std::max(0.0, Median(intercepts));
  return true;
}

// The line with a given fixed cost and the median cost per element beyond it.
Line LineThrough(double fixed_ns, const std::vector<SpeedGate::TimedStep>& steps) {
  std::vector<double> per_element;
  for (const auto& step : steps) per_element.push_back((step.ns - fixed_ns) / step.elements);
  return {fixed_ns, Median(per_element)};
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
  (step_compiled_ ? compiled_ : uncompiled_)
      .push_back(
          {static_cast<double>(step_elements_), static_cast<double>(now_ns - step_start_ns_)});
  const size_t wanted = static_cast<size_t>(options_.samples);
  if (compiled_.size() < wanted || uncompiled_.size() < wanted) return false;
  // Both ways' lines over every timed step's elements (see the header).
  Line uncompiled, compiled;
  // Steps of one size: time proportional to the elements.
  if (!FitLine(uncompiled_, &uncompiled)) uncompiled = LineThrough(0, uncompiled_);
  if (!FitLine(compiled_, &compiled)) {  // the uncompiled fixed cost, at most the fastest step's
    double fixed_ns = uncompiled.fixed_ns;
    for (const auto& step : compiled_) fixed_ns = std::min(fixed_ns, step.ns);
    compiled = LineThrough(fixed_ns, compiled_);
  }
  double elements = 0, compiled_total = 0, uncompiled_total = 0;
  for (const std::vector<TimedStep>* steps : {&compiled_, &uncompiled_}) {
    for (const TimedStep& step : *steps) {
      elements += step.elements;
      compiled_total += compiled.At(step.elements);
      uncompiled_total += uncompiled.At(step.elements);
    }
  }
  verdict->clusters = clusters_;
  verdict->compiled_ns = compiled_total / elements;
  verdict->uncompiled_ns = uncompiled_total / elements;
  verdict->run_compiled = compiled_total <= uncompiled_total * (1 + options_.margin);
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

}  // namespace jit
}  // namespace tf_ext

extern "C" int TfExtJitSetSpeedGate(int enable) {
  const int previous = tf_ext::jit::SpeedGateEnabled() ? 1 : 0;
  if (enable >= 0) tf_ext::jit::SetSpeedGateEnabled(enable > 0);
  return previous;
}

extern "C" int64_t TfExtJitSpeedVerdictCount(void) {
  return tf_ext::jit::ProcessSpeedGates().Count();
}

extern "C" int64_t TfExtJitSpeedVerdicts(int64_t after, char* buffer, int64_t capacity) {
  return tf_ext::jit::CopyText(tf_ext::jit::ProcessSpeedGates().FormatAfter(after), buffer,
                               capacity);
}
