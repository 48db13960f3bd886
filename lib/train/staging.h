// Node-local staging (`[data] stage_dir`): one rank per node copies the dataset's shards
// to node-local storage and verifies them (io/stage.h); the node's other ranks wait on the node
// communicator; every rank learns the directory to read from. An error on the copying rank is
// sent to the node's other ranks, so they all fail with the same message instead of hanging.
#pragma once
#include <mpi.h>

#include <string>

#include "io/dataset.h"
#include "io/stage.h"

namespace kilter::train {

// Collective over `node_comm`. `local_rank` (this rank's rank in node_comm) 0 copies. Returns
// the directory every rank should read from: `stage_dir`, or index.dir when stage_dir is empty.
// `report` (optional) receives the copying rank's figures on every rank.
std::string stage_dataset(const io::DatasetIndex& index, const std::string& stage_dir,
                          MPI_Comm node_comm, int local_rank, io::StageReport* report = nullptr);

}  // namespace kilter::train
