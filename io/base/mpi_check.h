// KILTER_MPI_CHECK: turns a failed MPI call into a kilter::Error carrying the call's name and
// MPI's own message (communicators made by app/launch.cpp return error codes instead of aborting).
#pragma once
#include <mpi.h>

#include <string>

#include "io/base/error.h"

namespace kilter {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

}  // namespace kilter

#define KILTER_MPI_CHECK(call, what)                                                    \
  do {                                                                                  \
    const int kilter_mpi_rc_ = (call);                                                  \
    KILTER_CHECK(kilter_mpi_rc_ == MPI_SUCCESS,                                         \
                 what << " failed: " << ::kilter::mpi_error_string(kilter_mpi_rc_));    \
  } while (0)
