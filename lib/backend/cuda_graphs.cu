// CudaModel's CUDA-graph cache (train.cuda_graphs; cuda_model_impl.cuh): each segment of a batch
// layout (forward + loss, the LM-head backward, each block's backward, the embedding backward) is
// run eagerly twice through the capture engine, captured and launched the third time, replayed and
// timed the fourth, and kept only where its replay measured faster than the warm eager run.
// Capture happens on a private stream, so that the NCCL communicator, which orders itself after
// the compute stream from its own thread, can never join a capture.
#include <cstdio>
#include <exception>

#include "lib/backend/cuda_model_impl.cuh"

namespace kilter::backend {

void CudaModel::run_segment(int segment, const std::function<void()>& body) {
  if (!options_.cuda_graphs || batch_cudnn_ || batch_sdpa_ || exchange_ != nullptr) {
    body();
    return;
  }
  GraphEntry& entry = graphs_[std::make_pair(layout_now_.key(), segment)];
  const int occurrence = entry.seen < 5 ? ++entry.seen : entry.seen;
  if (occurrence == 5 && !entry.decided) entry.decided = decide_graph(entry);
  if (entry.eager_only) {
    body();
    return;
  }
  if (entry.exec != nullptr) {
    if (occurrence == 4) KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[2], stream_));
    KILTER_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream_));
    if (occurrence == 4) KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[3], stream_));
    return;
  }
  // Work for the capture engine, on its stream, ordered after the compute stream and before
  // whatever the compute stream does next.
  auto on_capture_engine = [&](const auto& work) {
    s_ = capture_stream_;
    g_ = gemm_capture_.get();
    try {
      work();
    } catch (...) {
      s_ = stream_;
      g_ = gemm_.get();
      throw;
    }
    s_ = stream_;
    g_ = gemm_.get();
  };
  if (occurrence <= 2) {
    // Eager through the capture engine, so that its cuBLASLt descriptors and algorithms are
    // chosen now and not inside the capture, and the graph uses the same ones. The second run,
    // warm, is timed against the graph's replay.
    KILTER_CUDA_CHECK(cudaEventRecord(to_capture_stream_, stream_));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(capture_stream_, to_capture_stream_, 0));
    if (occurrence == 2) {
      for (cudaEvent_t& event : entry.timing) KILTER_CUDA_CHECK(cudaEventCreate(&event));
      KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[0], capture_stream_));
    }
    on_capture_engine(body);
    if (occurrence == 2) KILTER_CUDA_CHECK(cudaEventRecord(entry.timing[1], capture_stream_));
    KILTER_CUDA_CHECK(cudaEventRecord(from_capture_stream_, capture_stream_));
    KILTER_CUDA_CHECK(cudaStreamWaitEvent(stream_, from_capture_stream_, 0));
    return;
  }
  // Third occurrence: capture, instantiate, launch. A failure leaves this segment of this shape
  // eager from then on (said once) and runs it eagerly now: the captured work never ran.
  cudaGraph_t graph = nullptr;
  std::string failure;
  cudaError_t status = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal);
  if (status == cudaSuccess) {
    try {
      on_capture_engine(body);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    status = cudaStreamEndCapture(capture_stream_, &graph);
    if (failure.empty() && status != cudaSuccess) failure = cudaGetErrorString(status);
    if (failure.empty()) {
      status = cudaGraphInstantiate(&entry.exec, graph, 0);
      if (status != cudaSuccess) {
        failure = cudaGetErrorString(status);
        entry.exec = nullptr;
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  } else {
    failure = cudaGetErrorString(status);
  }
  if (!failure.empty()) {
    cudaGetLastError();
    entry.eager_only = true;
    ++graphs_dropped_;
    std::fprintf(stderr, "kilter: cuda backend: CUDA graph capture of segment %d for N=%d (%d pieces) failed (%s); it runs eagerly\n",
                 segment, layout_now_.N, layout_now_.pieces, failure.c_str());
    body();
    return;
  }
  KILTER_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream_));
}

// Keeps the graph if its replay (occurrence 4) took at least 3% less GPU time than the warm
// eager run (occurrence 2); a tie stays eager, the simpler path. Never blocks on the timing.
bool CudaModel::decide_graph(GraphEntry& entry) {
  if (entry.eager_only || entry.exec == nullptr) return true;
  const cudaError_t ready = cudaEventQuery(entry.timing[3]);
  if (ready == cudaErrorNotReady) return false;
  KILTER_CUDA_CHECK(ready);
  float eager_ms = 0.0f, graph_ms = 0.0f;
  KILTER_CUDA_CHECK(cudaEventElapsedTime(&eager_ms, entry.timing[0], entry.timing[1]));
  KILTER_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, entry.timing[2], entry.timing[3]));
  for (cudaEvent_t& event : entry.timing) {
    cudaEventDestroy(event);
    event = nullptr;
  }
  if (graph_ms < 0.97f * eager_ms) {
    ++graphs_kept_;
    return true;
  }
  KILTER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the graph may still be queued
  cudaGraphExecDestroy(entry.exec);
  entry.exec = nullptr;
  entry.eager_only = true;
  ++graphs_dropped_;
  return true;
}

void CudaModel::drop_graphs() {
  for (auto& entry : graphs_) {
    if (entry.second.exec != nullptr) cudaGraphExecDestroy(entry.second.exec);
    for (cudaEvent_t event : entry.second.timing)
      if (event != nullptr) cudaEventDestroy(event);
  }
  graphs_.clear();
  graphs_kept_ = graphs_dropped_ = 0;
}

}  // namespace kilter::backend
