// The CUDA engine's observer delivery without a GPU (kernels/impl/observer_delivery.hpp): the
// staging ring hands out ranges first in, first out and waits when full; the delivery queue runs
// jobs in order on its own thread, reports an observer's exception once on the engine's thread,
// and never delivers what was discarded. Also: make_cuda_engine in a build without CUDA, and (in
// CUDA builds) the packed layout of the attention probabilities the device writes.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/device_info.hpp"
#include "kernels/impl/observer_delivery.hpp"
#ifdef KVTIER_WITH_CUDA
#include "kernels/impl/cuda_kernels.cuh"
#endif

namespace kk = kvtier::kernels;
using kk::detail::DeliveryQueue;
using kk::detail::StagingRing;

TEST_CASE("the staging ring hands out aligned ranges first in, first out",
          "[kernels][cuda][delivery]") {
  StagingRing ring(1024);
  CHECK(ring.acquire(300) == 0);
  CHECK(ring.acquire(300) == 512);  // aligned to 256 bytes
  CHECK(ring.held() == 2);
  CHECK_THROWS_AS(ring.acquire(2000), std::logic_error);  // can never fit
  CHECK_THROWS_AS(ring.resize(4096), std::logic_error);   // ranges are held

  // A third range fits only at the start, once the first is released: acquire waits for that.
  std::atomic<bool> acquired{false};
  std::size_t third = 1;
  std::thread waiter([&] {
    third = ring.acquire(300);
    acquired = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(acquired);
  ring.release();
  waiter.join();
  CHECK(acquired);
  CHECK(third == 0);  // wrapped around
  // Releasing [512, 812) leaves [0, 300) held: the next range goes after it.
  ring.release();
  CHECK(ring.acquire(200) == 512);
  ring.release();
  ring.release();
  CHECK(ring.held() == 0);
  CHECK_THROWS_AS(ring.release(), std::logic_error);
  ring.resize(4096);
  CHECK(ring.capacity() == 4096);
  CHECK(ring.acquire(4096) == 0);
  ring.clear();
  CHECK(ring.held() == 0);
}

TEST_CASE("asynchronous delivery runs jobs in order on a thread of its own",
          "[kernels][cuda][delivery]") {
  DeliveryQueue queue(true);
  std::vector<int> delivered;
  std::atomic<int> released{0};
  std::atomic<bool> other_thread{true};
  const auto caller = std::this_thread::get_id();
  for (int i = 0; i < 100; ++i) {
    queue.push({[] {},
                [&, i] {
                  other_thread = other_thread && std::this_thread::get_id() != caller;
                  delivered.push_back(i);
                },
                [&] { ++released; }});
  }
  queue.flush();
  REQUIRE(delivered.size() == 100);
  for (int i = 0; i < 100; ++i) {
    CHECK(delivered[static_cast<std::size_t>(i)] == i);
  }
  CHECK(released == 100);
  CHECK(other_thread);
}

TEST_CASE("an observer's exception is reported once, on the engine's thread",
          "[kernels][cuda][delivery]") {
  DeliveryQueue queue(true);
  std::vector<int> delivered;
  std::atomic<int> released{0};
  const auto job = [&](int i) {
    return DeliveryQueue::Job{[] {},
                              [&, i] {
                                if (i == 2) {
                                  throw std::logic_error("observer refused step 2");
                                }
                                delivered.push_back(i);
                              },
                              [&] { ++released; }};
  };
  for (int i = 0; i < 5; ++i) {
    queue.push(job(i));
  }
  queue.wait_idle();
  CHECK(queue.failed());
  CHECK(released == 5);  // jobs after the failure are released, not delivered
  CHECK(delivered == std::vector<int>{0, 1});
  CHECK_THROWS_WITH(queue.flush(), "observer refused step 2");
  CHECK_FALSE(queue.failed());
  CHECK_NOTHROW(queue.flush());  // reported once
  queue.push(job(7));
  queue.flush();
  CHECK(delivered == std::vector<int>{0, 1, 7});
}

namespace {

// Until `queue` releases jobs undelivered; bounded, so that a queue that never does fails the
// test's checks instead of hanging it.
void wait_until_releasing(DeliveryQueue& queue) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!queue.releasing_undelivered() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
}

}  // namespace

TEST_CASE("discarded jobs are released without being delivered", "[kernels][cuda][delivery]") {
  DeliveryQueue queue(true);
  std::vector<int> delivered;
  std::atomic<int> released{0};
  std::promise<void> started;
  std::promise<void> go;
  std::shared_future<void> go_future = go.get_future().share();
  // The first job is being delivered (its wait has begun) when discard_pending() is called: it
  // completes; the ones queued behind it are released only.
  queue.push({[&] {
                started.set_value();
                go_future.wait();
              },
              [&] { delivered.push_back(0); }, [&] { ++released; }});
  for (int i = 1; i < 5; ++i) {
    queue.push({[] {}, [&, i] { delivered.push_back(i); }, [&] { ++released; }});
  }
  started.get_future().wait();
  // The first job's wait ends only once discard_pending() has begun, whatever the scheduling.
  std::thread opener([&] {
    wait_until_releasing(queue);
    go.set_value();
  });
  queue.discard_pending();
  opener.join();
  CHECK(delivered == std::vector<int>{0});
  CHECK(released == 5);
  // Delivery goes on afterwards.
  queue.push({[] {}, [&] { delivered.push_back(9); }, [&] { ++released; }});
  queue.flush();
  CHECK(delivered == std::vector<int>{0, 9});
}

TEST_CASE("a queue destroyed with jobs pending releases them without delivering",
          "[kernels][cuda][delivery]") {
  std::atomic<int> delivered{0};
  std::atomic<int> released{0};
  std::promise<void> started;
  std::promise<void> go;
  std::shared_future<void> go_future = go.get_future().share();
  std::thread opener;
  {
    DeliveryQueue queue(true);
    queue.push({[&started, go_future] {
                  started.set_value();
                  go_future.wait();
                },
                [&] { ++delivered; }, [&] { ++released; }});
    for (int i = 0; i < 10; ++i) {
      queue.push({[] {}, [&] { ++delivered; }, [&] { ++released; }});
    }
    started.get_future().wait();
    // The first job, popped before the destructor began, waits until the destructor has begun.
    opener = std::thread([&queue, &go] {
      wait_until_releasing(queue);
      go.set_value();
    });
  }
  opener.join();
  CHECK(released == 11);
  CHECK(delivered == 1);  // the job already popped when the destructor began, and no other
}

TEST_CASE("synchronous delivery runs each job at once on the caller's thread",
          "[kernels][cuda][delivery]") {
  DeliveryQueue queue(false);
  CHECK_FALSE(queue.asynchronous());
  const auto caller = std::this_thread::get_id();
  bool same_thread = false;
  int released = 0;
  queue.push(
      {[] {}, [&] { same_thread = std::this_thread::get_id() == caller; }, [&] { ++released; }});
  CHECK(same_thread);
  CHECK(released == 1);
  CHECK_THROWS_WITH(
      queue.push({[] {}, [] { throw std::runtime_error("at once"); }, [&] { ++released; }}),
      "at once");
  CHECK(released == 2);  // released before the exception left push()
  CHECK_NOTHROW(queue.flush());
}

TEST_CASE("make_cuda_engine refuses what it cannot run", "[kernels][cuda]") {
  CHECK(kk::cuda_compute_dtype_name(kk::CudaComputeDtype::kBF16) == "bf16");
  CHECK(kk::cuda_compute_dtype_name(kk::CudaComputeDtype::kFP32) == "fp32");
  if (!kk::built_with_cuda()) {
    CHECK_THROWS_WITH(kk::make_cuda_engine(nullptr),
                      "the CUDA engine is not available in this build");
    CHECK_THROWS_AS(kk::make_cuda_engine(nullptr), kvtier::ConfigError);
  } else {
    CHECK_THROWS_AS(kk::make_cuda_engine(nullptr), kvtier::ConfigError);
  }
}

#ifdef KVTIER_WITH_CUDA
TEST_CASE("the packed probability layout adds up the rows' key counts", "[kernels][cuda]") {
  for (const int window : {0, 1, 4, 9}) {
    for (const int first_position : {0, 1, 3, 8, 20}) {
      std::int64_t sum = 0;
      for (int row = 0; row < 30; ++row) {
        INFO("window " << window << ", first position " << first_position << ", row " << row);
        REQUIRE(kk::cuda::keys_before_row(row, first_position, window) == sum);
        const int position = first_position + row;
        const int first = kk::cuda::first_key(position, window);
        CHECK(first == (window > 0 ? std::max(0, position - window + 1) : 0));
        CHECK(kk::cuda::key_count(position, window) == position - first + 1);
        sum += kk::cuda::key_count(position, window);
      }
    }
  }
}
#endif
