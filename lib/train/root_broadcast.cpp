// Sharing one rank's read with every rank (see root_broadcast.h).
#include "lib/train/root_broadcast.h"

#include <algorithm>

#include "io/base/error.h"

namespace kilter::train {

void share_outcome(MPI_Comm world, int root, const std::string& local_error, const std::string& what,
                   ErrorKind kind) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  long long length = rank == root ? (long long)local_error.size() : 0;
  MPI_Bcast(&length, 1, MPI_LONG_LONG, root, world);
  if (length == 0) return;
  std::string message = rank == root ? local_error : std::string(size_t(length), '\0');
  MPI_Bcast(message.data(), int(length), MPI_CHAR, root, world);
  if (rank == root) KILTER_FAIL_KIND(kind, message);
  KILTER_FAIL_KIND(kind, what << " failed on rank " << root << ": " << message);
}

void broadcast_floats(MPI_Comm world, std::vector<float>& data, int root) {
  long long size = (long long)data.size();
  MPI_Bcast(&size, 1, MPI_LONG_LONG, root, world);
  data.resize(size_t(size));
  const size_t slice = size_t(1) << 28;
  for (size_t offset = 0; offset < data.size(); offset += slice) {
    int count = int(std::min(slice, data.size() - offset));
    MPI_Bcast(data.data() + offset, count, MPI_FLOAT, root, world);
  }
}

void broadcast_string(MPI_Comm world, std::string& s, int root) {
  long long length = (long long)s.size();
  MPI_Bcast(&length, 1, MPI_LONG_LONG, root, world);
  s.resize(size_t(length));
  if (length > 0) MPI_Bcast(s.data(), int(length), MPI_CHAR, root, world);
}

}  // namespace kilter::train
