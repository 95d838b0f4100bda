// Status helpers shared by every Ember library.
//
// Ember uses absl::Status / absl::StatusOr<T> everywhere. Conversions happen at the seams only:
// RocksDB -> absl in meta/store, absl <-> gRPC in the RPC layer, absl -> errno in cachefs.
#pragma once

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"

#define EMBER_CONCAT_INNER_(a, b) a##b
#define EMBER_CONCAT_(a, b) EMBER_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not ok.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status _ember_status = (expr);         \
    if (!_ember_status.ok()) return _ember_status; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, StatusOrExpr()): binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(EMBER_CONCAT_(_ember_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

namespace ember {

// A status that carries an exact errno (ENOTDIR, EEXIST, EROFS, ...): what a FUSE reply or a
// volume operation (meta/volumes.h) answers with. Its code is Unknown; CarriedErrno reads it.
inline constexpr char kErrnoPayload[] = "ember.errno";
inline absl::Status ErrnoStatus(int err, const std::string& message) {
  absl::Status s(absl::StatusCode::kUnknown, message);
  s.SetPayload(kErrnoPayload, absl::Cord(std::to_string(err)));
  return s;
}
// The errno a status carries from ErrnoStatus; 0 when it carries none.
inline int CarriedErrno(const absl::Status& status) {
  auto p = status.GetPayload(kErrnoPayload);
  return p ? std::atoi(std::string(*p).c_str()) : 0;
}

}  // namespace ember
