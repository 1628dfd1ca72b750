// The one error type of the table cores: a code (what kind of failure, so that every adapter raises
// the same error for it) and a message that names the table. No TensorFlow types; the TensorFlow
// kernels turn it into a Status in one place (DynamicTable::FromCore).
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_TABLE_ERROR_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_TABLE_ERROR_H_

#include <string>
#include <utility>

#include "kernels/dynamic_embedding/core/limits.h"

namespace tf_ext {
namespace de {

class TableError {
 public:
  enum class Code {
    kOk,
    kInvalidArgument,     // the call's arguments or a file do not fit the table
    kNotFound,            // a file that is not there
    kDataLoss,            // a file that is damaged, truncated or not a snapshot
    kResourceExhausted,   // a limit (limits.h) or memory
    kFailedPrecondition,  // the table's state does not allow the call (a delta with no base)
    kInternal,            // anything else
  };

  TableError() = default;
  TableError(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static TableError Ok() { return TableError(); }
  static TableError Invalid(std::string message) {
    return TableError(Code::kInvalidArgument, std::move(message));
  }
  static TableError NotFound(std::string message) {
    return TableError(Code::kNotFound, std::move(message));
  }
  static TableError DataLoss(std::string message) {
    return TableError(Code::kDataLoss, std::move(message));
  }
  static TableError OverLimit(std::string message) {
    return TableError(Code::kResourceExhausted, std::move(message));
  }
  // A GPU table core's message ("" when it succeeded): a limit's is kResourceExhausted.
  static TableError FromMessage(std::string message) {
    if (message.empty()) return Ok();
    const Code code = IsOverLimit(message) ? Code::kResourceExhausted : Code::kInternal;
    return TableError(code, std::move(message));
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_TABLE_ERROR_H_
