// HARP's transport: multi-stream TCP connections driven by worker threads, with the calls NCCL's
// proxy makes (listen, connect, accept, isend, irecv, test, close) as its interface. No NCCL or
// TensorFlow types: kernels/harp/nccl_net_plugin.cc adapts this to ncclNet_v6 ... v12.
//
// Threads: the caller (NCCL's proxy thread) posts requests into a per-connection single-producer/
// single-consumer ring and polls each request's atomic state; one worker thread drives each
// connection's sockets and bookkeeping. Nothing on that path blocks on a lock. Connection set-up
// (listen/connect/accept) runs in the caller's thread and never blocks. The caller spins on Test
// anyway, so the first HARP_CALLER_CONNECTIONS connections that carry a large message it claims
// and drives itself, as it does small-message connections below (see Transport::Drive).
//
// Small-message fast path: while a connection carries only small messages (at most kInlineBytes:
// on the sending side, every send outstanding; on the receiving side, the last message matched,
// and none larger still receiving), the caller drives the connection itself, in Send/Receive and
// Test, instead of handing it to the worker (a wake-up and two thread hops per message, which
// dominate the latency of small messages). Who touches a connection's sockets and state is
// decided by an ownership flag that either thread may only try to take (an atomic exchange; a
// thread that finds it taken skips the connection and never waits): the caller runs one pass
// inline when it gets it; the worker runs its passes when it gets it. A receiving connection in
// that mode is the caller's (the worker does not poll it: its requests are tested, and each test
// is a pass; only when the caller ran no pass over a whole poll period, 50 ms, does the worker run
// one, so that data keeps flowing while the caller waits on something else); a sending one stays
// in the worker's poll set, and a pass the caller leaves unfinished (a full socket) wakes the
// worker. A larger send, or a pass that matches a larger message, returns the connection to the
// worker. Messages of at most kMaxInlinePayloadBytes travel whole on the control socket (see
// wire_format.h): one segment per small message.
//
// Rules, as NCCL expects them:
//   - connect/accept return kOk with a null connection while the connection is being set up;
//   - Send/Receive return kOk with a null request when the connection has kMaxRequests (send side:
//     kMaxRequests * kMaxReceivesPerRequest) outstanding: try again later;
//   - messages match receives in posting order; a receive may be larger than its message, and
//     Test reports the message's size; a message larger than its receive fails the connection;
//   - a failed connection (peer gone, malformed frame, timeout) makes Test and later calls return
//     an error; they never hang.
#ifndef TF_EXT_KERNELS_HARP_CORE_TRANSPORT_H_
#define TF_EXT_KERNELS_HARP_CORE_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/harp/core/build_info.h"
#include "kernels/harp/core/config.h"
#include "kernels/harp/core/spsc_ring.h"
#include "kernels/harp/core/wire_format.h"

struct pollfd;

namespace tf_ext {
namespace harp HARP_HIDDEN {

constexpr int kMaxRequests = 32;           // NCCL_NET_MAX_REQUESTS
constexpr int kMaxReceivesPerRequest = 8;  // maxRecvs: buffers of one grouped receive
constexpr int kSendRequests = kMaxRequests * kMaxReceivesPerRequest;
// Messages a receiver tracks at once; at least the receive buffers that can be posted.
constexpr uint64_t kMessageWindow = kSendRequests;
// The small-message fast path's bound: a send of at most this many bytes, or a grouped receive of
// at most this many bytes in all, may be driven by the caller's thread (see above).
constexpr uint64_t kInlineBytes = 16 * 1024;

enum class Status { kOk, kInvalidArgument, kInvalidUsage, kSystemError, kInternalError, kRemote };

// No IP TOS of HARP's choosing (NCCL's NCCL_NET_TRAFFIC_CLASS_UNDEF).
constexpr int kNoTrafficClass = -1;
constexpr int kMaxTrafficClass = 255;

enum class LogLevel { kInfo, kWarning };
// A plain function pointer, not std::function: a std template instantiated over HARP's types would
// be exported from the plugin (the std namespace is default-visible).
using LogFunction = void (*)(LogLevel, const std::string&);

class Connection;
class Worker;

// One isend or (grouped) irecv. Owned by its connection's pool; the caller's side allocates and
// frees (in Send/Receive and Test), the worker fills it in and publishes `state` last.
struct Request {
  enum State : int { kFree = 0, kPosted = 1, kDone = 2, kFailed = 3 };
  std::atomic<int> state{kFree};
  Connection* owner = nullptr;
  int slot = 0;
  int count = 0;       // buffers: 1 for a send, n for a grouped receive
  bool large = false;  // caller side: a send above kInlineBytes (its connection is the worker's)
  struct Buffer {
    uint8_t* data = nullptr;
    uint64_t capacity = 0;  // the posted size (send: the message size)
    int tag = 0;
    uint64_t size = 0;  // the matched message's size (receive side)
  } buffers[kMaxReceivesPerRequest];
};

// One direction of one connection: the control socket and its data streams, a request pool and
// the ring the caller posts into. Progress() belongs to whichever thread holds the connection
// (TryAcquire); everything else says which thread may call it.
class Connection {
 public:
  virtual ~Connection();
  bool is_send() const { return is_send_; }
  // Whether the caller's thread drives it itself, large messages too (HARP_CALLER_CONNECTIONS).
  bool caller_claimed() const { return caller_claimed_.load(std::memory_order_relaxed); }
  // Caller side: whether the connection has failed, and why (valid once failed() is true).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  const std::string& failure() const { return failure_; }

  // One pass over sockets and requests; true if anything moved. Only by the thread that holds the
  // connection (TryAcquire), or by a test driving a worker-less connection alone.
  virtual bool Progress() = 0;
  // Worker side, holding the connection: the sockets and events worth sleeping on, appended to
  // `fds`.
  virtual void AddPollEvents(std::vector<pollfd>* fds) const = 0;
  // Holding the connection: whether bytes are left that only socket readiness will move (a pass
  // of the caller's that leaves these must wake the worker).
  virtual bool HasUnfinishedWrites() const { return false; }

  // Either thread: takes the right to touch the connection's sockets and state, never waiting
  // (false: the other thread has it). Sequentially consistent, so that with the worker's sleep
  // flag no wake-up is lost (see Worker::Run).
  bool TryAcquire() { return !busy_.exchange(true, std::memory_order_seq_cst); }
  void ReleaseOwnership() { busy_.store(false, std::memory_order_seq_cst); }

 protected:
  Connection(bool is_send, int control_fd, std::vector<int> stream_fds, int pool_size);
  // Worker side: records the first failure, fails every request the worker holds or is handed.
  void Fail(const std::string& why);
  // Worker side: takes the next posted request, failing it at once if the connection failed.
  bool NextPosted(Request** request);
  static void Publish(Request* request, int state) {
    request->state.store(state, std::memory_order_release);
  }
  virtual void FailHeldRequests() = 0;

  const bool is_send_;
  int control_fd_;
  std::vector<int> stream_fds_;
  // Set by the caller (holding the connection) around its inline passes.
  bool inline_pass_ = false;
  // Receiving side: true while the messages coming are small (the last one matched was at most
  // kInlineBytes and none larger is still receiving): the caller drives the connection and the
  // worker leaves it alone. Written by whoever holds the connection, at the end of a pass.
  std::atomic<bool> caller_driven_{true};
  // Set once by the caller when it claims the connection (Transport::Drive): from then on the
  // caller drives it in Send/Receive and Test whatever its messages' sizes, and the worker leaves
  // it alone as it does a caller-driven receiving connection (one pass after a poll period in
  // which the caller ran none).
  std::atomic<bool> caller_claimed_{false};

 private:
  friend class Transport;
  friend class Worker;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::atomic<bool> close_requested_{false};
  std::atomic<bool> released_{false};  // set by the worker once it no longer touches this
  Worker* worker_ = nullptr;
  std::atomic<bool> busy_{false};  // the ownership flag (TryAcquire)
  // Inline passes the caller ran (it counts them), and the count the worker last saw (the
  // worker's own): a caller-driven connection the caller left alone for a whole poll period gets
  // a pass from the worker, so that data keeps flowing (and the peer's sends complete) even while
  // the caller tests something else.
  std::atomic<uint64_t> inline_passes_{0};
  uint64_t inline_passes_seen_ = 0;
  // Set by the worker when it tries to take the connection to build its poll set (cleared once it
  // did): tells a caller ending an inline pass that the worker may have skipped it.
  std::atomic<bool> poll_skipped_{false};
  // Caller side only, sending side: outstanding sends above kInlineBytes (while there are any,
  // the worker drives the connection).
  int large_outstanding_ = 0;
  // Caller side only: the pool and its free slots.
  std::vector<std::unique_ptr<Request>> pool_;
  std::vector<int> free_slots_;
  SpscRing<Request*, kSendRequests> posted_;
};

// The sending half: message descriptors on the control socket, each chunk on the free stream
// with the fewest bytes queued in its socket.
//
// Zero-copy (HARP_ZEROCOPY_THRESHOLD > 0): a chunk payload of at least the threshold goes with
// send(MSG_ZEROCOPY) on a stream with SO_ZEROCOPY (its header with a plain, copying send), and a
// message completes only once the kernel's completion notifications (the socket's error queue)
// cover every zero-copy send of its bytes: until then the kernel may still read the buffer. If
// SO_ZEROCOPY cannot be enabled, or a zero-copy send fails with ENOBUFS, sends copy (logged once).
class SendConnection : public Connection {
 public:
  SendConnection(int control_fd, std::vector<int> stream_fds, size_t chunk_bytes,
                 size_t zerocopy_threshold = 0, LogFunction log = nullptr);
  bool Progress() override;
  void AddPollEvents(std::vector<pollfd>* fds) const override;
  bool HasUnfinishedWrites() const override {
    return !failed() && (!messages_.empty() || !control_out_.empty());
  }
  // Any thread: zero-copy sends the kernel reported done, and those of them it had to copy
  // (loopback and veth always copy). For tests and logs.
  uint64_t zerocopy_completed() const {
    return zerocopy_completed_.load(std::memory_order_relaxed);
  }
  uint64_t zerocopy_copied() const { return zerocopy_copied_.load(std::memory_order_relaxed); }

 private:
  struct Message {
    Request* request;
    uint64_t sequence;
    uint64_t assigned = 0;          // bytes given to a stream
    uint64_t written = 0;           // bytes in the kernel's socket buffers
    uint64_t descriptor_end = 0;    // control bytes up to and including its descriptor
    uint64_t zerocopy_pending = 0;  // its zero-copy sends the kernel has not released yet
  };
  struct ZerocopySend {
    uint32_t id;        // the kernel's per-socket counter of zero-copy sends
    uint64_t sequence;  // of the message whose bytes it sent
  };
  struct Stream {
    Message* message = nullptr;  // the chunk in flight, or null when the stream is free
    uint8_t header[kChunkHeaderBytes];
    size_t header_sent = 0;
    uint64_t offset = 0, length = 0, payload_sent = 0;
    bool zerocopy = false;          // this chunk's payload goes with MSG_ZEROCOPY
    uint32_t next_zerocopy_id = 0;  // the id the kernel gives the next zero-copy send
    std::deque<ZerocopySend> zerocopy_in_flight;
  };
  bool FlushControl();
  int LeastQueuedFreeStream() const;
  bool HasUnassignedBytes();
  void AssignChunk(size_t index);
  bool DriveStream(size_t index);
  bool ReadCompletions(size_t index);
  void DisableZerocopy(const std::string& why);
  void LogZerocopyFallback(const std::string& why);
  void FailHeldRequests() override;

  const size_t chunk_bytes_;
  size_t zerocopy_threshold_;  // 0: every send copies
  LogFunction log_;
  std::atomic<uint64_t> zerocopy_completed_{0}, zerocopy_copied_{0};
  uint64_t next_sequence_ = 0;
  std::deque<Message> messages_;  // in posting order; completed from the front
  size_t next_to_assign_ = 0;     // index in messages_ of the first with unassigned bytes
  std::vector<uint8_t> control_out_;
  uint64_t control_queued_ = 0, control_flushed_ = 0;
  std::vector<Stream> streams_;
  size_t next_stream_ = 0;  // where LeastQueuedFreeStream's round-robin tie-break starts
  bool peer_closed_ = false;
};

// The receiving half: descriptors matched to posted receives in posting order, chunk payloads
// read straight into the matched buffers.
class ReceiveConnection : public Connection {
 public:
  ReceiveConnection(int control_fd, std::vector<int> stream_fds);
  bool Progress() override;
  void AddPollEvents(std::vector<pollfd>* fds) const override;

 private:
  struct PostedReceive {
    Request* request;
    bool matched[kMaxReceivesPerRequest] = {};
    int complete = 0;
  };
  struct Message {  // a matched message still receiving data
    bool active = false;
    uint64_t sequence = 0, size = 0;
    uint64_t received = 0;  // bytes claimed by chunk headers read so far
    uint64_t arrived = 0;   // bytes written into the buffer
    PostedReceive* receive = nullptr;
    int buffer = 0;
  };
  struct Stream {
    uint8_t header[kChunkHeaderBytes];
    size_t header_received = 0;
    Message* message = nullptr;  // set while reading a payload
    ChunkHeader chunk;
    uint64_t payload_received = 0;
    bool eof = false, stalled = false;
  };
  bool Pass();
  bool ReadControl();
  bool MatchDescriptors();
  bool DriveStream(size_t index);
  void FinishBuffer(Message* message);
  void CheckPeerClosed();
  void FailHeldRequests() override;

  std::deque<PostedReceive> receives_;
  std::vector<Message> messages_;  // kMessageWindow slots, by sequence modulo the window
  uint64_t active_messages_ = 0;   // of messages_: matched, with data still to come
  uint64_t large_active_ = 0;      // of those, above kInlineBytes
  bool last_large_ = false;        // the last message matched was above kInlineBytes
  uint64_t next_sequence_ = 0;     // of the next descriptor
  uint8_t control_in_[64 * kDescriptorBytes];  // holds a descriptor with the largest inline payload
  static_assert(sizeof(control_in_) >= kDescriptorBytes + kMaxInlinePayloadBytes, "");
  size_t control_begin_ = 0, control_end_ = 0;
  bool control_eof_ = false, control_stalled_ = false;
  bool control_awaiting_payload_ = false;  // a descriptor whose inline payload is incomplete
  std::vector<Stream> streams_;
};

// A listening socket and the connections arriving on it.
class ListenSocket;

class Transport {
 public:
  // Resolves the interface (Config::interface) and starts the workers.
  static Status Create(const Config& config, LogFunction log, std::unique_ptr<Transport>* out,
                       std::string* error);
  ~Transport();  // stops and joins the workers; every connection must be closed first

  const Config& config() const { return config_; }
  const std::string& interface_name() const { return interface_name_; }
  const std::string& address() const { return address_text_; }
  int link_speed_mbps() const { return link_speed_mbps_; }

  // `traffic_class`: the IP TOS byte (0-255) of every socket of the connections made (Listen: the
  // connections it accepts), NCCL's per-communicator trafficClass; kNoTrafficClass leaves the
  // system's default.
  Status Listen(void* handle, ListenSocket** out, int traffic_class = kNoTrafficClass);
  // `handle`: NCCL's copy of the listener's handle, the same buffer on every call for one
  // connection (HARP keeps its in-progress state in the handle's connector slot).
  Status Connect(void* handle, SendConnection** out, int traffic_class = kNoTrafficClass);
  Status Accept(ListenSocket* listener, ReceiveConnection** out);
  Status Send(SendConnection* connection, void* data, uint64_t size, int tag, Request** out);
  Status Receive(ReceiveConnection* connection, int count, void* const* data, const uint64_t* sizes,
                 const int* tags, Request** out);
  // `sizes`: room for the request's buffer count; filled once done.
  Status Test(Request* request, bool* done, uint64_t* sizes);
  // Returns once no worker touches the connection or its requests' buffers any more.
  void Close(Connection* connection);
  void CloseListen(ListenSocket* listener);

  // For tests: a worker-less pair of connections over already connected sockets (the caller
  // drives Progress()), and how a connection is posted to without a Transport.
  static Status PostSend(Connection* connection, void* data, uint64_t size, int tag, Request** out);
  static Status PostReceive(Connection* connection, int count, void* const* data,
                            const uint64_t* sizes, const int* tags, Request** out);
  static Status TestRequest(Request* request, bool* done, uint64_t* sizes, std::string* error);
  // The worker (an index into the HARP_NTHREADS workers) of the `ordinal`-th send or receive
  // connection; see Attach.
  static size_t WorkerFor(bool is_send, uint64_t ordinal, size_t workers);
  // Whether `traffic_class` is kNoTrafficClass or an IP TOS byte; `error` says why not.
  static bool ValidTrafficClass(int traffic_class, std::string* error);
  // For tests: which of the workers drives `connection` (-1 before it is attached).
  int WorkerIndex(const Connection* connection) const;

 private:
  struct PendingConnect;
  Transport(const Config& config, LogFunction log);
  // Caller side, after posting to or testing a request of `connection`: one inline pass when the
  // connection qualifies for the small-message fast path and the worker is not on it, else (or if
  // the pass left writes unfinished) a wake-up of the worker. `posted`: a request was just posted
  // (the worker must see it unless the inline pass took it).
  void Drive(Connection* connection, bool posted);
  // Caller side: claims `connection` for the caller's thread if fewer than
  // HARP_CALLER_CONNECTIONS are claimed; whether it did.
  bool TryClaim(Connection* connection);
  void Log(LogLevel level, const std::string& message) const;
  void Attach(Connection* connection);

  Config config_;
  LogFunction log_;
  uint32_t ipv4_address_ = 0;
  std::string interface_name_, address_text_;
  int link_speed_mbps_ = 10000;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint64_t> next_send_worker_{0}, next_receive_worker_{0};
  // Connections the caller drives itself (claimed), at most config_.caller_connections.
  std::atomic<int> caller_claims_{0};
  // Connects in progress; a handle's connector slot is trusted only if it names one of these.
  std::mutex pending_mutex_;
  std::unordered_set<PendingConnect*> pending_connects_;
};

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_TRANSPORT_H_
