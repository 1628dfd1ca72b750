// The speed gate's decisions (the TensorFlow pass and op around it are tested from Python:
// tests/jit/test_bucketing.py, test_the_speed_gate_*).
#include "kernels/jit/core/speed_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace tf_ext {
namespace jit {
namespace {

SpeedGateOptions Short() {
  SpeedGateOptions options;
  options.settle = 2;
  options.samples = 3;
  options.margin = 0.05;
  options.recheck_every = 20;
  return options;
}

// Steps through a gate on a simulated clock: a step takes `compiled_ns` per element when one of
// its clusters ran compiled, `uncompiled_ns` when none did. A step's time is known when the next
// step begins.
struct Steps {
  SpeedGate* gate;
  int64_t step = 0;
  int64_t clock = 0;
  bool finished = false;  // the last step completed a check
  SpeedVerdict verdict;
  std::vector<bool> asked;  // the last step's decision per cluster

  // One step of clusters of `elements` elements each; `ready` per cluster: XLA's answer if asked.
  // Returns per cluster whether it ran compiled.
  std::vector<bool> Run(int64_t elements, double compiled_ns, double uncompiled_ns,
                        std::vector<bool> ready = {true}) {
    const int64_t id = ++step;
    std::vector<bool> compiled;
    asked.clear();
    finished = false;
    for (bool is_ready : ready) {
      bool done = false;
      const bool ask = gate->Begin(id, elements, clock, &verdict, &done);
      if (ask) gate->Ready(id, is_ready);
      asked.push_back(ask);
      compiled.push_back(ask && is_ready);
      finished = finished || done;
    }
    const bool any_compiled = std::find(compiled.begin(), compiled.end(), true) != compiled.end();
    clock += static_cast<int64_t>(elements * ready.size() *
                                  (any_compiled ? compiled_ns : uncompiled_ns));
    return compiled;
  }
  bool One(int64_t elements, double compiled_ns, double uncompiled_ns, bool ready = true) {
    return Run(elements, compiled_ns, uncompiled_ns, {ready})[0];
  }
  // Steps until a check completes (at most `limit`); the ways the steps ran.
  std::vector<bool> UntilVerdict(int64_t elements, double compiled_ns, double uncompiled_ns,
                                 int limit = 200) {
    std::vector<bool> ways;
    for (int i = 0; i < limit; ++i) {
      ways.push_back(One(elements, compiled_ns, uncompiled_ns));
      if (finished) break;
    }
    return ways;
  }
};

TEST(SpeedGateTest, UntilAnExecutableIsReadyItAsksXlaEveryStep) {
  SpeedGate gate("c", Short());
  Steps steps{&gate};
  for (int i = 0; i < 50; ++i) {
    EXPECT_FALSE(steps.One(100, 1, 1000, /*ready=*/false));
    EXPECT_TRUE(steps.asked[0]);
  }
  EXPECT_EQ(gate.Verdict(), -1);
}

TEST(SpeedGateTest, AnUncompiledVerdictStopsAskingForGood) {
  SpeedGate gate("cluster_0", Short());
  Steps steps{&gate};
  // Warming: compiled while the compiler settles (`settle` ready steps), then the check
  // alternates, compiled first, until each way has `samples` timed steps; the last step's time is
  // known when the next one begins.
  const std::vector<bool> ways = steps.UntilVerdict(100, 3, 1);
  EXPECT_EQ(ways,
            (std::vector<bool>{true, true, true, true, false, true, false, true, false, false}));
  EXPECT_EQ(steps.verdict.clusters, "cluster_0");
  EXPECT_FALSE(steps.verdict.run_compiled);
  EXPECT_DOUBLE_EQ(steps.verdict.compiled_ns, 3);
  EXPECT_DOUBLE_EQ(steps.verdict.uncompiled_ns, 1);
  EXPECT_EQ(gate.Verdict(), 0);
  // Final: XLA is not asked again, not even after recheck_every steps (the batches are no longer
  // padded, so asking would compile new shapes).
  for (int i = 0; i < 5 * Short().recheck_every; ++i) {
    EXPECT_FALSE(steps.One(100, 0.1, 1));
    EXPECT_FALSE(steps.asked[0]);
  }
  EXPECT_EQ(gate.Verdict(), 0);
}

TEST(SpeedGateTest, ComparesTimePerElementAndAllowsTheMargin) {
  // Compiled 4% slower per element (within the 5% margin), on batches of other sizes.
  SpeedGate gate("c", Short());
  Steps steps{&gate};
  int64_t elements = 50;
  for (int i = 0; i < 200 && !steps.finished; ++i) {
    steps.One(elements, 1.04, 1.0);
    elements = elements == 50 ? 400 : 50;
  }
  ASSERT_TRUE(steps.finished);
  EXPECT_TRUE(steps.verdict.run_compiled);
  EXPECT_NEAR(steps.verdict.compiled_ns, 1.04, 1e-9);
  EXPECT_EQ(gate.Verdict(), 1);
}

TEST(SpeedGateTest, WeighsEachStepsFixedCost) {
  // A step costs 500 ns plus 1 ns per element compiled, 100 ns plus 1.2 ns per element
  // uncompiled. Over these steps compiled is faster, but its timed steps happen to include three
  // small ones, whose time per element is mostly the fixed cost: medians of time per element
  // would call compiled 1.5x slower. The fitted lines get the verdict right.
  SpeedGateOptions options = Short();
  options.samples = 6;
  SpeedGate gate("c", options);
  std::vector<int64_t> compiled_sizes = {8000, 7000, 6000, 300, 200, 100};
  std::vector<int64_t> uncompiled_sizes = {6000, 5000, 4000, 3000, 2000, 1000};
  int64_t clock = 0, step = 0;
  SpeedVerdict verdict;
  bool finished = false;
  while (!finished && step < 40) {
    ++step;
    // Warming: 3 ready steps compiled; then the check alternates, compiled first.
    const bool expect_compiled = step <= 3 || step % 2 == 0;
    std::vector<int64_t>& sizes = expect_compiled ? compiled_sizes : uncompiled_sizes;
    const int64_t elements = sizes.empty() ? 1000 : sizes.back();
    if (step > 3 && !sizes.empty()) sizes.pop_back();
    const bool ask = gate.Begin(step, elements, clock, &verdict, &finished);
    if (finished) break;
    ASSERT_EQ(ask, expect_compiled) << "step " << step;
    gate.Ready(step, true);
    clock += ask ? 500 + elements : 100 + 12 * elements / 10;
  }
  ASSERT_TRUE(finished);
  EXPECT_TRUE(compiled_sizes.empty() && uncompiled_sizes.empty());
  EXPECT_TRUE(verdict.run_compiled);
  const double elements = 21600 + 21000;
  EXPECT_NEAR(verdict.compiled_ns, (12 * 500 + elements) / elements, 1e-9);
  EXPECT_NEAR(verdict.uncompiled_ns, (12 * 100 + 1.2 * elements) / elements, 1e-9);
}

TEST(SpeedGateTest, ACompiledVerdictIsCheckedAgainAfterRecheckEverySteps) {
  SpeedGate gate("c", Short());
  Steps steps{&gate};
  steps.UntilVerdict(10, 1, 2);
  ASSERT_TRUE(steps.finished);
  EXPECT_EQ(gate.Verdict(), 1);
  // The machine changed: XLA now loses. Everything runs compiled until the next check.
  int compiled_before_check = 0;
  for (int i = 1; i < Short().recheck_every; ++i) compiled_before_check += steps.One(10, 2, 1);
  EXPECT_EQ(compiled_before_check, Short().recheck_every - 1);
  steps.UntilVerdict(10, 2, 1);
  ASSERT_TRUE(steps.finished);
  EXPECT_FALSE(steps.verdict.run_compiled);
  EXPECT_FALSE(steps.One(10, 2, 1));
}

TEST(SpeedGateTest, OneDecisionPerStepForEveryClusterOfTheGraph) {
  SpeedGate gate("cluster_0, cluster_1", Short());
  Steps steps{&gate};
  for (int i = 0; i < 40 && !steps.finished; ++i) {
    steps.Run(10, 3, 1, {true, true});
    EXPECT_EQ(steps.asked[0], steps.asked[1]);
  }
  ASSERT_TRUE(steps.finished);
  EXPECT_FALSE(steps.verdict.run_compiled);
  EXPECT_DOUBLE_EQ(steps.verdict.compiled_ns, 3);  // per element of both clusters
  EXPECT_EQ(steps.Run(10, 3, 1, {true, true}), (std::vector<bool>{false, false}));
}

TEST(SpeedGateTest, AStepWhoseClusterHadNothingReadyDoesNotCount) {
  // One cluster of two is still compiling: a step meant to run compiled ran partly uncompiled,
  // and is not counted.
  SpeedGate gate("a, b", Short());
  Steps steps{&gate};
  for (int i = 0; i < 100; ++i) {
    const std::vector<bool> ways = steps.Run(10, 1, 5, {true, false});
    EXPECT_FALSE(ways[1]);
  }
  EXPECT_EQ(gate.Verdict(), -1);  // no compiled step could count
  steps.UntilVerdict(10, 1, 5);
  ASSERT_TRUE(steps.finished);
  EXPECT_TRUE(steps.verdict.run_compiled);
}

TEST(SpeedGatesTest, OneGatePerKeyAndAVerdictLog) {
  SpeedGates gates;
  SpeedGate* a = gates.Get("graph#1", "cluster_a");
  EXPECT_EQ(gates.Get("graph#1", "cluster_a"), a);
  EXPECT_NE(gates.Get("graph#2", "cluster_a"), a);
  SpeedVerdict first{0, "cluster\ta", false, 12.5, 10};
  SpeedVerdict second{0, "cluster_b", true, 1, 2};
  gates.Record(&first);
  gates.Record(&second);
  EXPECT_EQ(first.sequence, 1);
  EXPECT_EQ(second.sequence, 2);
  EXPECT_EQ(gates.Count(), 2);
  EXPECT_EQ(gates.FormatAfter(0), "1\tcluster a\t0\t12.5\t10\n2\tcluster_b\t1\t1\t2\n");
  EXPECT_EQ(gates.FormatAfter(1), "2\tcluster_b\t1\t1\t2\n");
  EXPECT_EQ(gates.FormatAfter(2), "");
}

TEST(SpeedGatesTest, TheCInterfaceSwitchesAndCopiesTheLog) {
  const int before = TfExtJitSetSpeedGate(1);
  EXPECT_EQ(TfExtJitSetSpeedGate(-1), 1);
  EXPECT_TRUE(SpeedGateEnabled());
  EXPECT_EQ(TfExtJitSetSpeedGate(0), 1);
  EXPECT_FALSE(SpeedGateEnabled());
  TfExtJitSetSpeedGate(before);

  SpeedVerdict verdict{0, "cluster_c", true, 1, 3};
  ProcessSpeedGates().Record(&verdict);
  EXPECT_EQ(TfExtJitSpeedVerdictCount(), verdict.sequence);
  const std::string expected = ProcessSpeedGates().FormatAfter(verdict.sequence - 1);
  char small[4];
  EXPECT_EQ(TfExtJitSpeedVerdicts(verdict.sequence - 1, small, sizeof(small)),
            static_cast<int64_t>(expected.size()));
  EXPECT_EQ(small[0], '\0');
  std::vector<char> buffer(expected.size() + 1);
  EXPECT_EQ(TfExtJitSpeedVerdicts(verdict.sequence - 1, buffer.data(), buffer.size()),
            static_cast<int64_t>(expected.size()));
  EXPECT_EQ(std::string(buffer.data()), expected);
}

// Steps of several session.run calls at once, on many threads: the gate stays consistent (one
// decision per step id at a time) and checks still complete. Run under ThreadSanitizer by `make
// sanitize`.
TEST(SpeedGateTest, ConcurrentCallersKeepItConsistent) {
  SpeedGate gate("c", Short());
  std::atomic<int64_t> next_step{0};
  std::atomic<int64_t> clock{0};
  std::atomic<int> verdicts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        const int64_t id = ++next_step;
        for (int cluster = 0; cluster < 2; ++cluster) {
          SpeedVerdict verdict;
          bool finished = false;
          if (gate.Begin(id, 10, clock.fetch_add(10), &verdict, &finished)) gate.Ready(id, true);
          if (finished) ++verdicts;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_GE(verdicts.load(), 1);
  EXPECT_NE(gate.Verdict(), -1);
}

}  // namespace
}  // namespace jit
}  // namespace tf_ext
