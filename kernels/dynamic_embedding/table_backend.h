// The operations the table kernels (find, insert, remove, the optimizer step) are written against,
// once for both places a table lives:
//   CpuTableBackend  the CPU table core (embedding_table.h): host tensors, work split over the
//                    intra-op thread pool;
//   GpuTableBackend  the GPU table core (core/gpu/device_table.h): device tensors, the op's CUDA
//                    stream; int64 keys.
// The kernels validate their inputs, allocate their outputs and call the backend of the table's
// resource, so the CPU registration runs every line of a kernel that the GPU registration runs;
// the GPU one adds only the stream and the placement.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_BACKEND_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_BACKEND_H_

#include <cstdint>
#include <string>

#include "kernels/dynamic_embedding/core/gpu/device_table.h"
#include "kernels/dynamic_embedding/core/optimizers.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ext {

template <typename Key>
class TableBackend {
 public:
  virtual ~TableBackend() = default;
  // `keys` is a tensor of the table's key type (any shape), in the memory of the op's device.
  // rows[keys.NumElements(), dim]: the rows; a missing key's initial row. present (null, or one
  // per key in the same memory as rows): whether each key had a row.
  virtual ::tensorflow::Status Find(::tensorflow::OpKernelContext* ctx,
                                    const ::tensorflow::Tensor& keys, float* rows,
                                    bool* present) = 0;
  // Sets the rows of keys to rows[n, dim]; of a key given twice, the last row wins.
  virtual ::tensorflow::Status Insert(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys, const float* rows) = 0;
  virtual ::tensorflow::Status Remove(::tensorflow::OpKernelContext* ctx,
                                      const ::tensorflow::Tensor& keys) = 0;
  // One optimizer step for distinct keys with gradients[n, dim] (the table's admission first).
  virtual ::tensorflow::Status Apply(::tensorflow::OpKernelContext* ctx,
                                     const de::OptimizerParams& params, int64_t step,
                                     const ::tensorflow::Tensor& keys, const float* gradients) = 0;
};

// The op's CUDA stream (null on a CPU device), from TensorFlow's stream executor: no CUDA header.
cudaStream_t StreamOf(::tensorflow::OpKernelContext* ctx);

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_TABLE_BACKEND_H_
