#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/transport_internal.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

// ---------------------------------------------------------------------------------------------
// Worker: one thread driving the sockets of the connections assigned to it.

Worker::Worker(int cpu) : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), cpu_(cpu) {
  pthread_create(&thread_, nullptr, &Worker::Start, this);
}

Worker::~Worker() {
  stop_.store(true, std::memory_order_seq_cst);
  Signal();
  pthread_join(thread_, nullptr);
  for (Connection* connection : connections_) delete connection;
  for (Connection* connection : incoming_) delete connection;
  close(wake_fd_);
}

void Worker::Add(Connection* connection) {
  {
    std::lock_guard<std::mutex> lock(mutex_);  // connection set-up only, not the data path
    incoming_.push_back(connection);
    has_incoming_.store(true, std::memory_order_seq_cst);
  }
  Wake();
}

void Worker::Signal() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

bool Worker::HasWork() {
  if (has_incoming_.load(std::memory_order_seq_cst) || stop_.load(std::memory_order_seq_cst)) {
    return true;
  }
  for (Connection* connection : connections_) {
    if (connection->close_requested_.load(std::memory_order_seq_cst)) return true;
    if (CallerDriven(connection)) continue;
    if (!connection->posted_.Empty()) return true;
  }
  return false;
}

bool Worker::CallerDriven(const Connection* connection) {
  return connection->caller_claimed_.load(std::memory_order_seq_cst) ||
         (!connection->is_send() && connection->caller_driven_.load(std::memory_order_seq_cst));
}

void* Worker::Start(void* self) {
  auto* worker = static_cast<Worker*>(self);
  if (worker->cpu_ >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(worker->cpu_, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  worker->Run();
  return nullptr;
}

void Worker::Run() {
  std::vector<pollfd> fds;
  while (!stop_.load(std::memory_order_acquire)) {
    if (has_incoming_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      connections_.insert(connections_.end(), incoming_.begin(), incoming_.end());
      incoming_.clear();
      has_incoming_.store(false, std::memory_order_seq_cst);
    }
    bool moved = false;
    const auto now = Clock::now();
    const bool idle_check = now - last_idle_check_ >= std::chrono::milliseconds(kPollMs);
    if (idle_check) last_idle_check_ = now;
    for (size_t i = 0; i < connections_.size();) {
      Connection* connection = connections_[i];
      if (connection->close_requested_.load(std::memory_order_acquire)) {
        connections_[i] = connections_.back();
        connections_.pop_back();
        // The last touch: from here the closing thread owns (and deletes) the connection.
        connection->released_.store(true, std::memory_order_release);
        continue;
      }
      // A connection the caller holds (an inline pass) is skipped: the caller finishes its pass
      // and wakes this worker if it leaves anything for it.
      if (!CallerDriven(connection)) {
        if (connection->TryAcquire()) {
          moved |= connection->Progress();
          connection->ReleaseOwnership();
        }
      } else if (idle_check) {
        // The caller drives it, but ran no pass over a whole poll period: one pass here.
        const uint64_t passes = connection->inline_passes_.load(std::memory_order_relaxed);
        if (passes == connection->inline_passes_seen_ && connection->TryAcquire()) {
          moved |= connection->Progress();
          connection->ReleaseOwnership();
        }
        connection->inline_passes_seen_ = passes;
      }
      ++i;
    }
    if (moved) continue;
    // Announce the sleep first, then look at the connections: a caller that posts, or finishes
    // an inline pass, after this sees the flag and signals; one that did so before is seen here.
    sleeping_.exchange(1, std::memory_order_seq_cst);
    fds.clear();
    fds.push_back(pollfd{wake_fd_, POLLIN, 0});
    for (Connection* connection : connections_) {
      if (CallerDriven(connection)) continue;
      // Set before trying: a caller whose inline pass made us skip it sees this when done.
      connection->poll_skipped_.store(true, std::memory_order_seq_cst);
      if (!connection->TryAcquire()) continue;
      connection->poll_skipped_.store(false, std::memory_order_relaxed);
      connection->AddPollEvents(&fds);
      connection->ReleaseOwnership();
    }
    // The timeout bounds how long a missed edge (e.g. a peer's FIN on a socket we were not
    // polling) can go unnoticed; it is not on the data path.
    if (!HasWork()) poll(fds.data(), fds.size(), kPollMs);
    sleeping_.store(0, std::memory_order_seq_cst);
    uint64_t drained;
    while (read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Connection

Connection::Connection(bool is_send, int control_fd, std::vector<int> stream_fds, int pool_size)
    : is_send_(is_send), control_fd_(control_fd), stream_fds_(std::move(stream_fds)) {
  for (int slot = 0; slot < pool_size; ++slot) {
    pool_.push_back(std::make_unique<Request>());
    pool_.back()->owner = this;
    pool_.back()->slot = slot;
    free_slots_.push_back(pool_size - 1 - slot);
  }
}

Connection::~Connection() {
  CloseFd(&control_fd_);
  for (int& fd : stream_fds_) CloseFd(&fd);
}

void Connection::Fail(const std::string& why) {
  if (!failed_.load(std::memory_order_relaxed)) {
    failure_ = why;
    failed_.store(true, std::memory_order_release);
  }
  FailHeldRequests();
}

bool Connection::NextPosted(Request** request) {
  while (posted_.Pop(request)) {
    if (!failed_.load(std::memory_order_relaxed)) return true;
    Publish(*request, Request::kFailed);
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Assigning connections to workers

// Sends and receives take turns over the workers separately, receives starting half-way round:
// NCCL sets up a send and a receive per channel in an order of its own, and a single round-robin
// could put every channel's send (each direction's bulk copying) on the same worker. With n
// workers, the k-th send goes to worker k mod n, the k-th receive to (k + n/2) mod n: two channels
// on four workers use all four cores, and with two or more workers the first send and the first
// receive never share one.
size_t Transport::WorkerFor(bool is_send, uint64_t ordinal, size_t workers) {
  return static_cast<size_t>((ordinal + (is_send ? 0 : workers / 2)) % workers);
}

void Transport::Attach(Connection* connection) {
  std::atomic<uint64_t>& next = connection->is_send() ? next_send_worker_ : next_receive_worker_;
  const size_t index = WorkerFor(connection->is_send(),
                                 next.fetch_add(1, std::memory_order_relaxed), workers_.size());
  connection->worker_ = workers_[index].get();
  connection->worker_->Add(connection);
}

int Transport::WorkerIndex(const Connection* connection) const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].get() == connection->worker_) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
