// Whether a Session's XLA clusters run faster compiled, measured on its own steps: the Session
// counterpart of tf_ext/jit/speed_check.py (tf_ext.jit.function's check).
//
// XLA's code is not always faster than TensorFlow's kernels (on some CPUs oneDNN's matmuls win),
// and then a cluster is better run as TensorFlow's own function call, without even asking XLA for
// an executable (which would compile every new shape). The gate pass
// (kernels/jit/xla_speed_gate_pass.cc) makes each lazily compiled cluster's _XlaCompile
// conditional on a TfExtXlaSpeedGate op, and reports _XlaCompile's "an executable is ready" back
// through TfExtXlaSpeedGateReady; every such op of one graph asks one SpeedGate.
//
// What is timed is the whole step, not a cluster: clusters run beside other work (table updates,
// the input pipeline), and a cluster that is faster alone can still make the step slower. One
// decision covers every cluster of a step, and a step's time runs from its first gate to the next
// step's first gate (the Session's steps run one after another).
//
// The phases: until executables are ready, every step asks XLA (as TensorFlow would); `settle`
// ready steps later a check runs `samples` steps each way, alternating, fits each way's step time
// as a fixed cost per step plus a cost per element (the gated clusters' input elements; Theil-Sen,
// so that one stalled step cannot move it), and compares the two lines over every timed step's
// elements; compiled wins unless it is more than `margin` slower. (Medians of time per element
// would swing with the sizes a check happens to draw: a small step's time per element is mostly
// its fixed cost. Where one way's steps all have about one size, its line has no slope: the
// uncompiled steps' time is then taken as proportional to the elements, the compiled steps'
// fixed cost as the uncompiled one's.) This is tf_ext.jit.function's rule too. A step in which a
// cluster had no executable ready while the step meant to run compiled is not counted. A compiled
// verdict is checked again after `recheck_every` steps; an uncompiled one is final
// (tf_ext.jit.Bucketing then stops padding, and checking again would make XLA compile the new
// shapes). TensorFlow-free and thread-safe.
#ifndef TF_EXT_KERNELS_JIT_CORE_SPEED_GATE_H_
#define TF_EXT_KERNELS_JIT_CORE_SPEED_GATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tf_ext {
namespace jit {

struct SpeedGateOptions {
  int settle = 8;            // ready steps before the first check (the compiler settles)
  int samples = 12;          // timed steps each way per check
  double margin = 0.05;      // compiled may be this much slower per element and still win
  int recheck_every = 1000;  // steps between checks while compiled wins
};

// A finished check.
struct SpeedVerdict {
  int64_t sequence = 0;      // 1, 2, ... over every gate of the process
  std::string clusters;      // the gated clusters: their _XlaCompile nodes' names, ", "-joined
  bool run_compiled = true;  // the verdict
  double compiled_ns = 0;    // fitted step time per input element over the check, compiled
  double uncompiled_ns = 0;  // fitted step time per input element over the check, uncompiled
};

class SpeedGate {
 public:
  struct TimedStep {
    double elements;
    double ns;
  };

  SpeedGate(std::string clusters, SpeedGateOptions options);

  // A cluster of step `step_id` is about to run: `elements` is its input elements, `now_ns` a
  // monotonic clock. Returns whether to ask XLA for its executable (else the cluster runs as a
  // function call). When the call completes a check (a new step closes the last timed one), fills
  // *verdict and sets *finished.
  bool Begin(int64_t step_id, int64_t elements, int64_t now_ns, SpeedVerdict* verdict,
             bool* finished);
  // XLA's answer for a cluster of step `step_id` that asked: whether an executable was ready.
  void Ready(int64_t step_id, bool ready);

  // The current verdict: 1 run compiled, 0 uncompiled, -1 none yet.
  int Verdict() const;

 private:
  enum class Phase { kWarming, kChecking, kHolding };
  // Closes the current step at `now_ns`: its time counts for the check if it was timed.
  bool CloseStep(int64_t now_ns, SpeedVerdict* verdict);

  const std::string clusters_;
  const SpeedGateOptions options_;
  mutable std::mutex mutex_;
  Phase phase_ = Phase::kWarming;
  int64_t steps_ = 0;
  int64_t ready_steps_ = 0;  // steps that found an executable ready (while warming)
  int64_t next_check_step_ = 0;
  int verdict_ = -1;
  std::vector<TimedStep> compiled_, uncompiled_;  // this check's timed steps
  // The current step.
  bool in_step_ = false;
  int64_t step_id_ = 0;
  bool step_compiled_ = false;       // its decision
  bool step_timed_ = false;          // counts for the check
  bool step_mixed_ = false;          // a cluster found no executable ready though it asked
  bool step_counted_ready_ = false;  // counted in ready_steps_
  int64_t step_elements_ = 0;
  int64_t step_start_ns_ = 0;
};

// The process's gates, one per gated graph (keyed by the name the pass gives it), and the log of
// their verdicts.
class SpeedGates {
 public:
  static constexpr size_t kLogCapacity = 1024;
  SpeedGates() = default;

  SpeedGate* Get(const std::string& key, const std::string& clusters);
  // Records a verdict; sets its sequence number.
  void Record(SpeedVerdict* verdict);
  // Verdicts recorded so far (the last one's sequence number).
  int64_t Count() const;
  // The kept verdicts with a sequence number above `after`, one per line, tab-separated in
  // SpeedVerdict's order (run_compiled as 0/1).
  std::string FormatAfter(int64_t after) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<SpeedGate>> gates_;
  std::vector<SpeedVerdict> log_;  // the newest kLogCapacity
  int64_t count_ = 0;
};

SpeedGates& ProcessSpeedGates();

// Whether the gate pass gates the clusters of graphs built from now on (tf_ext.jit.Bucketing sets
// it from TF_EXT_JIT_ADAPTIVE). Off by default: without it, XLA runs as TensorFlow decides.
bool SpeedGateEnabled();
void SetSpeedGateEnabled(bool enabled);

}  // namespace jit
}  // namespace tf_ext

// For tf_ext (through ctypes). Sets the switch (enable >= 0) and returns its previous value.
extern "C" int TfExtJitSetSpeedGate(int enable);
// How many verdicts the process has recorded: cheap enough to poll per batch.
extern "C" int64_t TfExtJitSpeedVerdictCount(void);
// The verdicts after `after` as SpeedGates::FormatAfter's text, NUL-terminated, into
// buffer[0..capacity); returns its length without the NUL (>= capacity: nothing was written but an
// empty string; retry with a larger buffer).
extern "C" int64_t TfExtJitSpeedVerdicts(int64_t after, char* buffer, int64_t capacity);

#endif  // TF_EXT_KERNELS_JIT_CORE_SPEED_GATE_H_
