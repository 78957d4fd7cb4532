#pragma once
// A CUDA graph captured from a stream and replayed, for the CUDA engine's decode steps
// (CudaGraphs::kDecode, docs/ENGINE.md "Decode graphs"). Host C++ over the CUDA runtime.
//
// A graph names the buffers its kernels were captured with: it may be replayed only while
// every one of them is where it was. The caller states them as a key (addresses and the sizes
// that shaped the launches); a replay with another key captures again.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/impl/cuda_handles.hpp"

namespace kvtier::kernels::cuda {

class StreamGraph {
 public:
  using Key = std::vector<std::uintptr_t>;

  StreamGraph() = default;
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  StreamGraph(StreamGraph&&) = delete;
  StreamGraph& operator=(StreamGraph&&) = delete;
  ~StreamGraph() { clear(); }

  [[nodiscard]] bool holds(const Key& key) const { return exec_ != nullptr && key == key_; }

  // Records what `enqueue` puts on `stream` (nothing runs) as the graph for `key`, replacing the
  // one held. Thread-local capture: other threads' CUDA calls are not affected. When `enqueue`
  // or the capture fails, nothing is held and the stream is out of capture.
  template <typename Enqueue>
  void capture(cudaStream_t stream, const Checker& check, Key key, Enqueue&& enqueue) {
    clear();
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    try {
      std::forward<Enqueue>(enqueue)();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) {
        static_cast<void>(cudaGraphDestroy(partial));
      }
      static_cast<void>(cudaGetLastError());  // an invalidated capture's error is not sticky
      throw;
    }
    cudaGraph_t graph = nullptr;
    checked(check, cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph, 0);
    static_cast<void>(cudaGraphDestroy(graph));  // the executable graph is a copy
    if (instantiated != cudaSuccess) {
      exec_ = nullptr;
      checked(check, instantiated, "cudaGraphInstantiate");
    }
    key_ = std::move(key);
  }

  void launch(cudaStream_t stream, const Checker& check) const {
    checked(check, cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

  void clear() noexcept {
    if (exec_ != nullptr) {
      static_cast<void>(cudaGraphExecDestroy(exec_));
      exec_ = nullptr;
    }
    key_.clear();
  }

 private:
  // Throws for a failed graph call, its error cleared first: the kernel launchers report
  // cudaGetLastError(), which must not name this failure again.
  static void checked(const Checker& check, cudaError_t status, const char* call) {
    if (status != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      check(status, call);
    }
  }

  cudaGraphExec_t exec_ = nullptr;
  Key key_;
};

}  // namespace kvtier::kernels::cuda
