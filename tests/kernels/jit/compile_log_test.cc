// The log of XLA compilations and its C interface (the TensorFlow listener that fills it is tested
// from Python: tests/jit/test_xla_compile_log.py).
#include "kernels/jit/core/compile_log.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tf_ext {
namespace jit {
namespace {

std::vector<std::vector<std::string>> ParseLines(const std::string& text) {
  std::vector<std::vector<std::string>> lines;
  std::istringstream stream(text);
  std::string line;
  while (std::getline(stream, line)) {
    std::vector<std::string> fields;
    size_t start = 0;
    for (size_t tab = line.find('\t'); tab != std::string::npos; tab = line.find('\t', start)) {
      fields.push_back(line.substr(start, tab - start));
      start = tab + 1;
    }
    fields.push_back(line.substr(start));
    lines.push_back(fields);
  }
  return lines;
}

TEST(CompileLogTest, NumbersEventsInOrderAndKeepsTheirFields) {
  CompileLog log(8);
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_EQ(log.Record("cluster_a", "GPU", 1, 1500, 1500), 1);
  EXPECT_EQ(log.Record("cluster_b", "CPU", 1, 700, 700), 2);
  EXPECT_EQ(log.Record("cluster_a", "GPU", 2, 300, 1800), 3);
  EXPECT_EQ(log.Count(), 3);

  const std::vector<CompileEvent> events = log.EventsAfter(0);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].sequence, 1);
  EXPECT_EQ(events[2].sequence, 3);
  EXPECT_EQ(events[2].cluster, "cluster_a");
  EXPECT_EQ(events[2].device, "GPU");
  EXPECT_EQ(events[2].compile_count, 2);
  EXPECT_EQ(events[2].compile_time_us, 300);
  EXPECT_EQ(events[2].cumulative_compile_time_us, 1800);
  EXPECT_GE(events[0].time, before - 1);
  EXPECT_LE(events[0].time, events[2].time);

  const auto lines = ParseLines(log.FormatAfter(0));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1],
            (std::vector<std::string>{"2", lines[1][1], "cluster_b", "CPU", "1", "700", "700"}));
  EXPECT_NEAR(std::stod(lines[1][1]), events[1].time, 1e-5);
}

TEST(CompileLogTest, KeepsTheNewestEventsButCountsAll) {
  CompileLog log(3);
  for (int i = 1; i <= 10; ++i) log.Record("c" + std::to_string(i), "", i, i, i);
  EXPECT_EQ(log.Count(), 10);
  const std::vector<CompileEvent> events = log.EventsAfter(0);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].sequence, 8);
  EXPECT_EQ(events[0].cluster, "c8");
  EXPECT_EQ(events[2].sequence, 10);
}

TEST(CompileLogTest, ReturnsOnlyEventsAfterTheGivenSequence) {
  CompileLog log(4);
  for (int i = 1; i <= 6; ++i) log.Record("c", "", i, i, i);  // keeps 3..6
  EXPECT_EQ(log.EventsAfter(4).size(), 2u);
  EXPECT_EQ(log.EventsAfter(4)[0].sequence, 5);
  EXPECT_EQ(log.EventsAfter(1).size(), 4u);  // 2 is gone: the kept ones
  EXPECT_EQ(log.EventsAfter(-5).size(), 4u);
  EXPECT_TRUE(log.EventsAfter(6).empty());
  EXPECT_TRUE(log.EventsAfter(100).empty());
  EXPECT_EQ(log.FormatAfter(6), "");
  EXPECT_TRUE(CompileLog(4).EventsAfter(0).empty());
}

TEST(CompileLogTest, ReplacesTabsAndLineBreaksInNames) {
  CompileLog log(4);
  log.Record("a\tb\nc\rd", "X\tY", 1, 1, 1);
  EXPECT_EQ(log.EventsAfter(0)[0].cluster, "a b c d");
  const auto lines = ParseLines(log.FormatAfter(0));
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_EQ(lines[0].size(), 7u);
  EXPECT_EQ(lines[0][2], "a b c d");
  EXPECT_EQ(lines[0][3], "X Y");
}

TEST(CompileLogTest, RecordsFromManyThreadsWithoutLosingOrReorderingEvents) {
  constexpr int kThreads = 8;
  constexpr int kEventsPerThread = 500;
  CompileLog log(kThreads * kEventsPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&log, t] {
      for (int i = 0; i < kEventsPerThread; ++i) {
        log.Record("thread" + std::to_string(t), "CPU", i + 1, 1, i + 1);
        if (i % 50 == 0) log.FormatAfter(log.Count() - 10);  // readers run alongside
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(log.Count(), kThreads * kEventsPerThread);
  const std::vector<CompileEvent> events = log.EventsAfter(0);
  ASSERT_EQ(events.size(), static_cast<size_t>(kThreads * kEventsPerThread));
  std::vector<int64_t> last_count(kThreads, 0);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence, static_cast<int64_t>(i + 1));
    // Each thread's own events appear in the order it recorded them.
    const int t = std::stoi(events[i].cluster.substr(std::string("thread").size()));
    EXPECT_EQ(events[i].compile_count, last_count[t] + 1);
    last_count[t] = events[i].compile_count;
  }
}

// The C interface reads the process log, which other tests in this binary do not touch.
TEST(CompileLogCApiTest, CopiesTheLogOrSaysHowLargeABufferItNeeds) {
  const int64_t start = TfExtJitCompileEventCount();
  ProcessCompileLog().Record("first", "CPU", 1, 10, 10);
  ProcessCompileLog().Record("second", "CPU", 1, 20, 20);
  EXPECT_EQ(TfExtJitCompileEventCount(), start + 2);

  const int64_t needed = TfExtJitCompileLog(start, nullptr, 0);
  ASSERT_GT(needed, 0);
  std::vector<char> small(needed, 'x');  // no room for the NUL: nothing but an empty string
  EXPECT_EQ(TfExtJitCompileLog(start, small.data(), needed), needed);
  EXPECT_EQ(small[0], '\0');
  EXPECT_EQ(small[1], 'x');

  std::vector<char> buffer(needed + 1, 'x');
  EXPECT_EQ(TfExtJitCompileLog(start, buffer.data(), needed + 1), needed);
  EXPECT_EQ(buffer[needed], '\0');
  const auto lines = ParseLines(std::string(buffer.data()));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0][0], std::to_string(start + 1));
  EXPECT_EQ(lines[0][2], "first");
  EXPECT_EQ(lines[1][2], "second");
  EXPECT_EQ(lines[1][5], "20");

  // Only what came after a sequence number.
  std::vector<char> last(256);
  TfExtJitCompileLog(start + 1, last.data(), static_cast<int64_t>(last.size()));
  EXPECT_EQ(ParseLines(last.data()).size(), 1u);
  EXPECT_EQ(TfExtJitCompileLog(start + 2, last.data(), static_cast<int64_t>(last.size())), 0);
  EXPECT_EQ(last[0], '\0');
}

int fake_async_compilation = 0;
int FakeAsyncCompilationHook(int enable) {
  const int previous = fake_async_compilation;
  if (enable >= 0) fake_async_compilation = enable > 0;
  return previous;
}

TEST(CompileLogCApiTest, ListenerStateAndAsyncSwitchReportWhatTheTensorflowSideInstalled) {
  EXPECT_EQ(TfExtJitListenerState(), 0);  // nothing registers a listener without TensorFlow
  EXPECT_EQ(TfExtJitSetAsyncCompilation(1), -1);
  SetListenerState(ListenerState::kUnavailable);
  EXPECT_EQ(TfExtJitListenerState(), -1);
  SetListenerState(ListenerState::kRegistered);
  EXPECT_EQ(TfExtJitListenerState(), 1);

  SetAsyncCompilationHook(&FakeAsyncCompilationHook);
  EXPECT_EQ(TfExtJitSetAsyncCompilation(1), 0);
  EXPECT_EQ(TfExtJitSetAsyncCompilation(-1), 1);  // a query
  EXPECT_EQ(TfExtJitSetAsyncCompilation(0), 1);
  EXPECT_EQ(TfExtJitSetAsyncCompilation(0), 0);
  SetAsyncCompilationHook(nullptr);
  SetListenerState(ListenerState::kNotRegistered);
}

}  // namespace
}  // namespace jit
}  // namespace tf_ext
