#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "kernels/harp/core/transport.h"
#include "kernels/harp/core/transport_internal.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

// ---------------------------------------------------------------------------------------------
// Posting and testing (the caller's side)

Status Transport::PostSend(Connection* connection, void* data, uint64_t size, int tag,
                           Request** out) {
  *out = nullptr;
  if (!connection->is_send()) return Status::kInvalidUsage;
  if (connection->failed()) return Status::kRemote;
  if (size > 0 && data == nullptr) return Status::kInvalidArgument;
  if (connection->free_slots_.empty()) return Status::kOk;  // full: NCCL tries again
  Request* request = connection->pool_[connection->free_slots_.back()].get();
  connection->free_slots_.pop_back();
  request->count = 1;
  request->buffers[0] = Request::Buffer{static_cast<uint8_t*>(data), size, tag, size};
  request->large = size > kInlineBytes;
  if (request->large) ++connection->large_outstanding_;
  request->state.store(Request::kPosted, std::memory_order_relaxed);
  connection->posted_.Push(request);  // never full: the ring holds the whole pool
  *out = request;
  return Status::kOk;
}

Status Transport::PostReceive(Connection* connection, int count, void* const* data,
                              const uint64_t* sizes, const int* tags, Request** out) {
  *out = nullptr;
  if (connection->is_send()) return Status::kInvalidUsage;
  if (count < 1 || count > kMaxReceivesPerRequest) return Status::kInvalidArgument;
  for (int b = 0; b < count; ++b) {
    if (sizes[b] > 0 && data[b] == nullptr) return Status::kInvalidArgument;
  }
  if (connection->failed()) return Status::kRemote;
  if (connection->free_slots_.empty()) return Status::kOk;
  Request* request = connection->pool_[connection->free_slots_.back()].get();
  connection->free_slots_.pop_back();
  request->count = count;
  for (int b = 0; b < count; ++b) {
    request->buffers[b] = Request::Buffer{static_cast<uint8_t*>(data[b]), sizes[b], tags[b], 0};
  }
  request->large = false;  // a receiving connection goes by the messages it matches instead
  request->state.store(Request::kPosted, std::memory_order_relaxed);
  connection->posted_.Push(request);
  *out = request;
  return Status::kOk;
}

Status Transport::TestRequest(Request* request, bool* done, uint64_t* sizes, std::string* error) {
  const int state = request->state.load(std::memory_order_acquire);
  *done = false;
  if (state == Request::kPosted) return Status::kOk;
  Connection* connection = request->owner;
  if (state != Request::kDone && state != Request::kFailed) return Status::kInvalidUsage;
  if (sizes != nullptr && state == Request::kDone) {
    for (int b = 0; b < request->count; ++b) sizes[b] = request->buffers[b].size;
  }
  request->state.store(Request::kFree, std::memory_order_relaxed);
  connection->free_slots_.push_back(request->slot);
  if (request->large) --connection->large_outstanding_;
  if (state == Request::kFailed) {
    *error = connection->failure();
    return Status::kRemote;
  }
  *done = true;
  return Status::kOk;
}
Status Transport::Send(SendConnection* connection, void* data, uint64_t size, int tag,
                       Request** out) {
  Status status = PostSend(connection, data, size, tag, out);
  if (*out != nullptr) Drive(connection, true);
  if (status == Status::kRemote) Log(LogLevel::kWarning, connection->failure());
  return status;
}

Status Transport::Receive(ReceiveConnection* connection, int count, void* const* data,
                          const uint64_t* sizes, const int* tags, Request** out) {
  Status status = PostReceive(connection, count, data, sizes, tags, out);
  if (*out != nullptr) Drive(connection, true);
  if (status == Status::kRemote) Log(LogLevel::kWarning, connection->failure());
  return status;
}

bool Transport::TryClaim(Connection* connection) {
  int claimed = caller_claims_.load(std::memory_order_relaxed);
  while (claimed < config_.caller_connections) {
    if (caller_claims_.compare_exchange_weak(claimed, claimed + 1, std::memory_order_relaxed)) {
      connection->caller_claimed_.store(true, std::memory_order_seq_cst);
      return true;
    }
  }
  return false;
}

void Transport::Drive(Connection* connection, bool posted) {
  const bool small = connection->is_send()
                         ? connection->large_outstanding_ == 0
                         : connection->caller_driven_.load(std::memory_order_seq_cst);
  // NCCL's proxy thread spins on test() whatever the transport: the first busy connections (up
  // to HARP_CALLER_CONNECTIONS) it drives itself, so that its spinning moves bytes; the workers
  // take the rest, each on a core of its own.
  const bool claimed = connection->caller_claimed() || (!small && TryClaim(connection));
  if (!small && !claimed) {
    if (posted) connection->worker_->Wake();  // the worker's connection, as before the fast path
    return;
  }
  // The small-message fast path: one pass in this thread, unless the worker holds the connection
  // (then it is making progress, and polls what it leaves; a request just posted it sees before it
  // sleeps). A pass that leaves writes unfinished hands them to the worker's poll.
  if (connection->TryAcquire()) {
    connection->inline_pass_ = true;
    const bool moved = connection->Progress();
    connection->inline_pass_ = false;
    connection->inline_passes_.fetch_add(1, std::memory_order_relaxed);
    // Leftover: writes only socket readiness will move, or a receiving connection that the pass
    // handed to the worker (it matched a large message).
    const bool leftover =
        connection->HasUnfinishedWrites() ||
        (!connection->is_send() && !connection->caller_driven_.load(std::memory_order_relaxed));
    connection->ReleaseOwnership();
    // A claimed connection's leftovers wait for the caller's next test (the worker looks only
    // after a poll period without one).
    if (!leftover || claimed) return;
    // A pass that moved nothing left things as the worker last saw them (or as an earlier pass
    // that woke it left them), unless the worker skipped the connection while building its poll
    // set because this thread held it: then the worker must look again. (Without this a caller
    // testing a send held back by a full socket would wake the worker on every test.)
    if (!moved && !posted &&
        !connection->poll_skipped_.exchange(false, std::memory_order_seq_cst)) {
      return;
    }
  } else if (!posted) {
    return;
  }
  connection->worker_->Wake();
}

Status Transport::Test(Request* request, bool* done, uint64_t* sizes) {
  if (request->state.load(std::memory_order_acquire) == Request::kPosted) {
    Drive(request->owner, false);
  }
  std::string error;
  Status status = TestRequest(request, done, sizes, &error);
  if (status != Status::kOk) Log(LogLevel::kWarning, error.empty() ? "HARP: bad request" : error);
  return status;
}

void Transport::Close(Connection* connection) {
  if (connection == nullptr) return;
  // Synchronous: once close returns, NCCL may free the buffers of requests still in flight, so
  // the worker must have let go of the connection first (it does within one pass of its loop).
  Worker* worker = connection->worker_;
  if (connection->caller_claimed()) caller_claims_.fetch_sub(1, std::memory_order_relaxed);
  connection->close_requested_.store(true, std::memory_order_seq_cst);
  worker->Wake();
  while (!connection->released_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  delete connection;
}

}  // namespace HARP_HIDDEN
}  // namespace tf_ext
