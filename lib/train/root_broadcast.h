// What one rank read reaching every rank (checkpoint loading, train.init_from): its outcome
// first, so a bad file is the same clear error on every rank and never a hang, then the data.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "io/base/error.h"

namespace kilter::train {

// Rank `root`'s outcome ("" = success) reaches every rank; every rank throws the same error
// (the others prefixed with "<what> failed on rank <root>: ").
void share_outcome(MPI_Comm world, int root, const std::string& local_error, const std::string& what,
                   ErrorKind kind = ErrorKind::internal);
// Broadcasts from `root`; the other ranks' vectors are resized to match (floats: in slices, since
// MPI counts are int).
void broadcast_floats(MPI_Comm world, std::vector<float>& data, int root);
void broadcast_string(MPI_Comm world, std::string& s, int root);

}  // namespace kilter::train
