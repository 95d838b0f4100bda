// Status helpers shared by every Ember library.
//
// Ember uses absl::Status / absl::StatusOr<T> everywhere. Conversions happen at the seams only:
// RocksDB -> absl in meta/store, absl <-> gRPC in the RPC layer, absl -> errno in cachefs.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
