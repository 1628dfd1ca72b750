// What the parts of HARP's transport share but its interface (transport.h) does not offer: the
// Worker class and the socket helpers. The parts, one concern each:
//   transport_worker.cc   the worker threads, the Connection base, which worker gets a connection
//   transport_send.cc     SendConnection: descriptors, chunks over the streams, zero-copy
//   transport_receive.cc  ReceiveConnection: matching descriptors to receives, reading chunks
//   transport_caller.cc   the caller's side: posting, testing, inline passes, closing
//   transport_setup.cc    creating the Transport, listen/connect/accept
#ifndef TF_EXT_KERNELS_HARP_CORE_TRANSPORT_INTERNAL_H_
#define TF_EXT_KERNELS_HARP_CORE_TRANSPORT_INTERNAL_H_

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/harp/core/build_info.h"
#include "kernels/harp/core/transport.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

using Clock = std::chrono::steady_clock;

inline std::string SystemError(const char* what) {
  return std::string(what) + ": " + strerror(errno);
}

inline bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

inline void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// One thread driving the sockets of the connections assigned to it (transport_worker.cc).
class Worker {
 public:
  // pthread rather than std::thread, whose state type (over this class) would be exported.
  explicit Worker(int cpu);
  ~Worker();

  void Add(Connection* connection);

  // Called after posting (or after an inline pass left work): a system call only when the worker
  // is (about to be) asleep. Both sides use sequentially consistent read-modify-writes on
  // `sleeping_` (an RMW reads the latest value, and the two synchronise), so either the worker sees
  // what the caller did before it decides to sleep, or the caller sees `sleeping_` and signals.
  void Wake() {
    if (sleeping_.fetch_add(0, std::memory_order_seq_cst) != 0) Signal();
  }

 private:
  void Signal();
  bool HasWork();
  // A connection the caller drives itself (a receiving one on the small-message fast path, or one
  // the caller claimed): the worker leaves it alone but for closing it and the idle check.
  static bool CallerDriven(const Connection* connection);
  static void* Start(void* self);
  void Run();

  static constexpr int kPollMs = 50;
  const int wake_fd_;
  const int cpu_;
  pthread_t thread_;
  Clock::time_point last_idle_check_ = Clock::now();  // the worker thread's own
  std::atomic<bool> stop_{false};
  std::atomic<int> sleeping_{0};
  std::mutex mutex_;
  std::vector<Connection*> incoming_;
  std::atomic<bool> has_incoming_{false};
  std::vector<Connection*> connections_;  // the worker thread's own
};

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_TRANSPORT_INTERNAL_H_
