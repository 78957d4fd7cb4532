#pragma once
// Owning handles of CUDA resources and the checked-call helper, shared by the CUDA engine and the
// tiered cache's CUDA backend. Host C++ over the CUDA runtime; every failing call is a
// kvtier::Error (exit 1) naming the call.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/impl/cuda_kernels.cuh"

namespace kvtier::kernels::cuda {

// "1.50 GiB", "12.0 MiB", "512 bytes": sizes in messages.
inline std::string size_text(double bytes) {
  std::ostringstream text;
  if (bytes >= static_cast<double>(1U << 30U)) {
    text << std::fixed << std::setprecision(2) << bytes / static_cast<double>(1U << 30U) << " GiB";
  } else if (bytes >= static_cast<double>(1U << 20U)) {
    text << std::fixed << std::setprecision(1) << bytes / static_cast<double>(1U << 20U) << " MiB";
  } else {
    text << std::fixed << std::setprecision(0) << bytes << " bytes";
  }
  return text.str();
}

// Every CUDA and cuBLAS call goes through one of these: a failure is a kvtier::Error (exit 1)
// naming the call.
class Checker {
 public:
  explicit Checker(int device) : device_(device) {}

  [[nodiscard]] std::string where() const { return "CUDA device " + std::to_string(device_); }

  void operator()(cudaError_t status, const std::string& call) const {
    if (status != cudaSuccess) {
      throw Error(
          call + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")",
          where(), ExitCode::kRuntimeFailure);
    }
  }
  void operator()(cublasStatus_t status, const std::string& call) const {
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw Error(call + " failed: " + cublasGetStatusName(status) + " (" +
                      cublasGetStatusString(status) + ")",
                  where(), ExitCode::kRuntimeFailure);
    }
  }

 private:
  int device_;
};

// Owning handles. Destructors ignore errors: they run on teardown, where nothing can be done.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(std::size_t bytes, const Checker& check) : bytes_(bytes) {
    if (bytes > 0) {
      check(cudaMalloc(&data_, bytes),
            "cudaMalloc (" + size_text(static_cast<double>(bytes)) + ")");
    }
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  DeviceMemory(DeviceMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      free();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~DeviceMemory() { free(); }

  [[nodiscard]] void* get() const { return data_; }
  [[nodiscard]] float* floats() const { return static_cast<float*>(data_); }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  void free() noexcept {
    if (data_ != nullptr) {
      static_cast<void>(cudaFree(data_));
      data_ = nullptr;
    }
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class PinnedMemory {
 public:
  PinnedMemory() = default;
  // `flags` as cudaHostAlloc's: cudaHostAllocMapped for memory kernels read and write in place.
  PinnedMemory(std::size_t bytes, const Checker& check, unsigned flags = cudaHostAllocDefault)
      : bytes_(bytes) {
    check(cudaHostAlloc(&data_, std::max<std::size_t>(bytes, 1), flags),
          "cudaHostAlloc (" + size_text(static_cast<double>(bytes)) + " pinned)");
    if ((flags & cudaHostAllocMapped) != 0U) {
      check(cudaHostGetDevicePointer(&device_, data_, 0), "cudaHostGetDevicePointer");
    }
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  PinnedMemory(PinnedMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        device_(std::exchange(other.device_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedMemory& operator=(PinnedMemory&& other) noexcept {
    if (this != &other) {
      free();
      data_ = std::exchange(other.data_, nullptr);
      device_ = std::exchange(other.device_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~PinnedMemory() { free(); }

  [[nodiscard]] std::byte* get() const { return static_cast<std::byte*>(data_); }
  // The device's address of mapped memory (nullptr unless allocated cudaHostAllocMapped).
  [[nodiscard]] std::byte* device() const { return static_cast<std::byte*>(device_); }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  void free() noexcept {
    if (data_ != nullptr) {
      static_cast<void>(cudaFreeHost(data_));
      data_ = nullptr;
      device_ = nullptr;
    }
  }
  void* data_ = nullptr;
  void* device_ = nullptr;
  std::size_t bytes_ = 0;
};

class Stream {
 public:
  // Selects `device` for the calling thread first: the stream and all that follows live there.
  Stream(const Checker& check, int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&&) = delete;
  Stream& operator=(Stream&&) = delete;
  ~Stream() {
    static_cast<void>(cudaStreamSynchronize(stream_));
    static_cast<void>(cudaStreamDestroy(stream_));
  }
  [[nodiscard]] cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Cublas {
 public:
  Cublas(const Checker& check, cudaStream_t stream) {
    check(cublasCreate(&handle_), "cublasCreate");
    const cublasStatus_t status = cublasSetStream(handle_, stream);
    if (status != CUBLAS_STATUS_SUCCESS) {
      static_cast<void>(cublasDestroy(handle_));
      check(status, "cublasSetStream");
    }
  }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  Cublas(Cublas&&) = delete;
  Cublas& operator=(Cublas&&) = delete;
  ~Cublas() { static_cast<void>(cublasDestroy(handle_)); }
  [[nodiscard]] cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Events reused once waited for: marks of when work has run, or (timing) pairs around copies.
class EventPool {
 public:
  EventPool(const Checker& check, bool timing) : check_(check), timing_(timing) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  EventPool(EventPool&&) = delete;
  EventPool& operator=(EventPool&&) = delete;
  ~EventPool() {
    for (cudaEvent_t event : free_) {
      static_cast<void>(cudaEventDestroy(event));
    }
  }

  [[nodiscard]] cudaEvent_t take() {
    {
      const std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t event = free_.back();
        free_.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    check_(cudaEventCreateWithFlags(&event, timing_ ? cudaEventDefault : cudaEventDisableTiming),
           "cudaEventCreateWithFlags");
    return event;
  }
  void give_back(cudaEvent_t event) noexcept {
    try {
      const std::lock_guard lock(mutex_);
      free_.push_back(event);
    } catch (...) {
      static_cast<void>(cudaEventDestroy(event));
    }
  }

 private:
  Checker check_;
  bool timing_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

inline Dtype device_dtype(CudaComputeDtype dtype) {
  switch (dtype) {
    case CudaComputeDtype::kBF16: return Dtype::kBF16;
    case CudaComputeDtype::kFP16: return Dtype::kF16;
    case CudaComputeDtype::kFP32: return Dtype::kF32;
  }
  return Dtype::kF32;
}

inline std::size_t dtype_bytes(Dtype dtype) {
  return dtype == Dtype::kF32 ? 4 : 2;
}

}  // namespace kvtier::kernels::cuda
