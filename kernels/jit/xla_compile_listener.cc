// Feeds TensorFlow's XLA compilations into the compile log (core/compile_log.h), and gives it the
// switch for TensorFlow's asynchronous XLA compilation.
//
// RegisterXlaActivityListener and GetXlaOpsCommonFlags live in libtensorflow_cc.so.2, which this
// library does not link (only libtensorflow_framework.so.2): Python's TensorFlow loads
// libtensorflow_cc privately (RTLD_LOCAL), so the dynamic linker would not find them for us, and a
// missing symbol would fail the whole library's load. They are looked up at load time instead;
// where they cannot be found the log stays empty and the switch reports -1, nothing fails.
#include <dlfcn.h>

#include <memory>
#include <string>
#include <utility>

#include "kernels/jit/core/compile_log.h"
#include "tensorflow/compiler/jit/flags.h"
#include "tensorflow/compiler/jit/xla_activity.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/lib/core/status.h"
#include "tensorflow/core/platform/hash.h"
#include "tensorflow/core/platform/logging.h"

// The listener's base class has out-of-line members (its destructor, Flush, its vtable and type
// info), defined in libtensorflow_cc as well. This library defines them itself, below, with hidden
// visibility: a listener built here then needs nothing from libtensorflow_cc at load time, and
// these copies stay private to this library.
#pragma GCC visibility push(hidden)
#include "tensorflow/compiler/jit/xla_activity_listener.h"
#pragma GCC visibility pop

namespace tensorflow {
XlaActivityListener::~XlaActivityListener() = default;
void XlaActivityListener::Flush() {}
}  // namespace tensorflow

namespace tf_ext {
namespace jit {
namespace {

// Mangled names, as `nm -D libtensorflow_cc.so.2` lists them.
constexpr char kRegisterListenerSymbol[] =
    "_ZN10tensorflow27RegisterXlaActivityListenerESt10unique_ptrINS_"
    "19XlaActivityListenerESt14default_deleteIS1_EE";
constexpr char kXlaOpsCommonFlagsSymbol[] = "_ZN10tensorflow20GetXlaOpsCommonFlagsEv";
constexpr char kOngoingCompilationsSymbol[] =
    "_ZNK10tensorflow25DeviceCompilationProfiler30GetNumOngoingAsyncCompilationsEv";
// What XlaCompileOp registers in its device's ResourceMgr: the name, and the type name whose
// Hash64 is the resource's type key (TypeIndex::Make<DeviceCompilationProfiler>()).
constexpr char kProfilerResourceName[] = "device_compilation_profiler";
constexpr char kProfilerTypeName[] = "N10tensorflow25DeviceCompilationProfilerE";
constexpr char kTensorflowCcLibrary[] = "libtensorflow_cc.so.2";

using RegisterListenerFunction = void (*)(std::unique_ptr<::tensorflow::XlaActivityListener>);
using XlaOpsCommonFlagsFunction = ::tensorflow::XlaOpsCommonFlags* (*)();

class CompileLogListener : public ::tensorflow::XlaActivityListener {
 public:
  ::tensorflow::Status Listen(const ::tensorflow::XlaAutoClusteringActivity&) override {
    return ::tensorflow::OkStatus();
  }

  ::tensorflow::Status Listen(const ::tensorflow::XlaJitCompilationActivity& activity) override {
    // The activity names no device: TensorFlow reports it from code that does not know one.
    ProcessCompileLog().Record(activity.cluster_name(), /*device=*/"", activity.compile_count(),
                               activity.compile_time_us(), activity.cumulative_compile_time_us());
    return ::tensorflow::OkStatus();
  }

  ::tensorflow::Status Listen(const ::tensorflow::XlaOptimizationRemark&) override {
    return ::tensorflow::OkStatus();
  }
};

// libtensorflow_cc, already loaded by TensorFlow (never loaded here: RTLD_NOLOAD), or null.
void* TensorflowCcHandle() {
  if (void* handle = dlopen(kTensorflowCcLibrary, RTLD_NOW | RTLD_NOLOAD)) return handle;
  // Loaded under a path the bare name does not match: it lies next to libtensorflow_framework.
  Dl_info framework;
  if (dladdr(reinterpret_cast<void*>(&::tensorflow::OpRegistry::Global), &framework) == 0 ||
      framework.dli_fname == nullptr) {
    return nullptr;
  }
  std::string path = framework.dli_fname;
  const size_t slash = path.rfind('/');
  path = (slash == std::string::npos ? "" : path.substr(0, slash + 1)) + kTensorflowCcLibrary;
  return dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
}

// A TensorFlow function: from libtensorflow_cc, or from whatever the process exports globally
// (a C program linked against libtensorflow.so, which holds the same functions).
void* FindTensorflowSymbol(void* tensorflow_cc, const char* name) {
  if (tensorflow_cc != nullptr) {
    if (void* symbol = dlsym(tensorflow_cc, name)) return symbol;
  }
  return dlsym(RTLD_DEFAULT, name);
}

XlaOpsCommonFlagsFunction xla_ops_common_flags = nullptr;
// DeviceCompilationProfiler::GetNumOngoingAsyncCompilations, a const member function: called with
// the object as its first argument (the Itanium C++ ABI's convention for `this`).
using OngoingCompilationsFunction = int64_t (*)(const void* profiler);
OngoingCompilationsFunction ongoing_compilations = nullptr;

int SetAsyncCompilation(int enable) {
  ::tensorflow::XlaOpsCommonFlags* flags = xla_ops_common_flags();
  const int previous = flags->tf_xla_async_compilation ? 1 : 0;
  if (enable >= 0) flags->tf_xla_async_compilation = enable > 0;
  return previous;
}

void ConnectToTensorflow() {
  void* tensorflow_cc = TensorflowCcHandle();
  auto register_listener = reinterpret_cast<RegisterListenerFunction>(
      FindTensorflowSymbol(tensorflow_cc, kRegisterListenerSymbol));
  if (register_listener != nullptr) {
    register_listener(std::make_unique<CompileLogListener>());
    SetListenerState(ListenerState::kRegistered);
  } else {
    SetListenerState(ListenerState::kUnavailable);
    LOG(WARNING) << "tf_ext: TensorFlow's RegisterXlaActivityListener was not found (is "
                 << kTensorflowCcLibrary << " loaded?): XLA compilations are not logged";
  }
  xla_ops_common_flags = reinterpret_cast<XlaOpsCommonFlagsFunction>(
      FindTensorflowSymbol(tensorflow_cc, kXlaOpsCommonFlagsSymbol));
  if (xla_ops_common_flags != nullptr) {
    SetAsyncCompilationHook(&SetAsyncCompilation);
  } else {
    LOG(WARNING) << "tf_ext: TensorFlow's GetXlaOpsCommonFlags was not found: asynchronous XLA "
                    "compilation cannot be switched";
  }
  ongoing_compilations = reinterpret_cast<OngoingCompilationsFunction>(
      FindTensorflowSymbol(tensorflow_cc, kOngoingCompilationsSymbol));
  // The handle stays open: TensorFlow keeps the listener, whose Listen it calls from then on.
}

// Once, when TensorFlow loads the op library.
[[maybe_unused]] const bool connected = (ConnectToTensorflow(), true);

// The profiler is looked up through a handle, by its type's hash, because naming its C++ type
// here would need that type's RTTI from libtensorflow_cc at load time.
class XlaOngoingCompilationsOp : public ::tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    ::tensorflow::Tensor* ongoing = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &ongoing));
    ongoing->scalar<int64_t>()() = Count(ctx);
  }

 private:
  static int64_t Count(::tensorflow::OpKernelContext* ctx) {
    if (ongoing_compilations == nullptr) return -1;
    ::tensorflow::ResourceMgr* resources = ctx->resource_manager();
    if (resources == nullptr) return 0;
    ::tensorflow::ResourceHandle handle;
    handle.set_device(ctx->device()->name());
    handle.set_container(resources->default_container());
    handle.set_name(kProfilerResourceName);
    handle.set_hash_code(::tensorflow::Hash64(kProfilerTypeName));
    ::tensorflow::ResourceBase* profiler = nullptr;
    if (!resources->Lookup(handle, &profiler).ok()) return 0;  // nothing compiled here yet
    // The profiler's only base is ResourceBase: both pointers are the object's address.
    const int64_t count = ongoing_compilations(profiler);
    profiler->Unref();
    return count;
  }
};

REGISTER_KERNEL_BUILDER(Name("TfExtXlaOngoingCompilations").Device(::tensorflow::DEVICE_CPU),
                        XlaOngoingCompilationsOp);

}  // namespace
}  // namespace jit
}  // namespace tf_ext
