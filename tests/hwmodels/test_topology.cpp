// Transfers routed through the node's topology share bandwidth on every edge they cross.

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "configs/schema/hardware.pb.h"
#include "hwmodels/topology.hpp"
#include "sim/simulator.hpp"
#include "tests/support/config_fixture.hpp"

using kvtier::hw::HostMemory;
using kvtier::hw::NodeTopology;
using kvtier::sim::Tick;

namespace {

kvtier::config::NodeSpec node(const char* name) {
  kvtier::config::NodeSpec spec;
  (void)kvtier::test::loader().load_preset(*kvtier::test::builtin_presets().find("node", name),
                                           spec, {});
  return spec;
}

// Completion time of each flow when all start together.
std::vector<Tick> finish_times(NodeTopology& topology, kvtier::sim::Simulator& simulator,
                               kvtier::sim::FlowNetwork& network,
                               const std::vector<std::vector<kvtier::sim::LinkId>>& paths,
                               std::uint64_t bytes) {
  std::vector<Tick> done(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    network.start_flow(paths[i], bytes, topology.copy_setup(),
                       [&done, &simulator, i] { done[i] = simulator.now(); });
  }
  simulator.run();
  return done;
}

constexpr std::uint64_t kBytes = 352'000'000;  // 10 ms at the Gen5 preset's 35.2 GB/s H2D

}  // namespace

TEST_CASE("an H2D copy crosses socket, switch uplink and GPU link at the host link's rate",
          "[topology]") {
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  NodeTopology topology(node("hgx-h100-8"), HostMemory::kPinned, network);
  CHECK(topology.gpu_count() == 8);
  CHECK(topology.host_to_gpu(0).size() == 3);  // ddr -> socket -> switch -> gpu
  const auto done = finish_times(topology, simulator, network, {topology.host_to_gpu(0)}, kBytes);
  CHECK(done[0] == Tick::us(5) + Tick::ms(10));
}

TEST_CASE("two GPUs behind one PCIe switch contend for its uplink", "[topology]") {
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  NodeTopology topology(node("hgx-h100-8"), HostMemory::kPinned, network);
  const auto shared = finish_times(topology, simulator, network,
                                   {topology.host_to_gpu(0), topology.host_to_gpu(1)}, kBytes);
  CHECK(shared[0] == Tick::us(5) + Tick::ms(20));
  CHECK(shared[1] == shared[0]);
}

TEST_CASE("GPUs behind different switches copy at full rate each", "[topology]") {
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  NodeTopology topology(node("hgx-h100-8"), HostMemory::kPinned, network);
  const auto separate = finish_times(topology, simulator, network,
                                     {topology.host_to_gpu(0), topology.host_to_gpu(2)}, kBytes);
  CHECK(separate[0] == Tick::us(5) + Tick::ms(10));
  CHECK(separate[1] == separate[0]);
}

TEST_CASE("memory on the far socket is reached through the slower inter-socket link",
          "[topology]") {
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  const auto spec = node("hgx-h100-8");
  NodeTopology topology(spec, HostMemory::kPinned, network);
  CHECK(topology.socket_of_gpu(0) == 0);
  CHECK(topology.socket_of_gpu(7) == 1);
  const auto far = finish_times(topology, simulator, network, {topology.host_to_gpu(0, 1)}, kBytes);
  const double factor = spec.host().remote_socket_h2d_factor();
  CHECK(kvtier::sim::to_seconds(far[0] - Tick::us(5)) == Approx(0.010 / factor).epsilon(1e-6));
}

TEST_CASE("pageable host memory slows copies by the link's pageable factor", "[topology]") {
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  const auto spec = node("hgx-h100-8");
  NodeTopology topology(spec, HostMemory::kPageable, network);
  const auto done = finish_times(topology, simulator, network, {topology.host_to_gpu(0)}, kBytes);
  CHECK(kvtier::sim::to_seconds(done[0] - Tick::us(5)) ==
        Approx(0.010 / spec.host_link().pageable_h2d_factor()).epsilon(1e-6));
}

TEST_CASE("GPU-to-GPU copies go over NVSwitch, not PCIe", "[topology]") {
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  NodeTopology topology(node("hgx-h100-8"), HostMemory::kPinned, network);
  const auto path = topology.gpu_to_gpu(0, 5);
  REQUIRE(path.size() == 2);
  CHECK(network.link_name(path[0]) == "gpu0->nvswitch");
  CHECK(network.link_name(path[1]) == "nvswitch->gpu5");
  // A single-GPU workstation has no peer path.
  kvtier::sim::Simulator other;
  kvtier::sim::FlowNetwork other_network(other);
  NodeTopology workstation(node("workstation-rtx5080"), HostMemory::kPinned, other_network);
  CHECK(workstation.gpu_count() == 1);
  CHECK(workstation.host_to_gpu(0).size() == 3);
}

TEST_CASE("a GPU's host memory is on its switch's socket, so a second socket slows no copy",
          "[topology]") {
  // Two GPUs on one switch: spreading GPUs rather than switches over the sockets put the second
  // GPU's memory on the far socket, behind the inter-socket link.
  for (const std::uint32_t sockets : {1U, 2U}) {
    kvtier::sim::Simulator simulator;
    kvtier::sim::FlowNetwork network(simulator);
    auto spec = node("hgx-h100-8");
    spec.set_gpus_per_node(2);
    spec.set_gpus_per_pcie_switch(2);
    spec.mutable_host()->set_sockets(sockets);
    NodeTopology topology(spec, HostMemory::kPinned, network);
    CAPTURE(sockets);
    CHECK(topology.socket_of_gpu(0) == 0);
    CHECK(topology.socket_of_gpu(1) == 0);
    CHECK(topology.host_to_gpu(1).size() == 3);  // ddr -> socket -> switch -> gpu
    const auto shared = finish_times(topology, simulator, network,
                                     {topology.host_to_gpu(0), topology.host_to_gpu(1)}, kBytes);
    CHECK(shared[0] == Tick::us(5) + Tick::ms(20));
    CHECK(shared[1] == shared[0]);
  }
  // Six GPUs, two a switch, on two sockets: switches 0 and 1 on socket 0, switch 2 on socket 1,
  // each GPU on its switch's.
  kvtier::sim::Simulator simulator;
  kvtier::sim::FlowNetwork network(simulator);
  auto spec = node("hgx-h100-8");
  spec.set_gpus_per_node(6);
  NodeTopology topology(spec, HostMemory::kPinned, network);
  const std::vector<std::uint32_t> expected = {0, 0, 0, 0, 1, 1};
  for (std::uint32_t g = 0; g < 6; ++g) {
    CAPTURE(g);
    CHECK(topology.socket_of_gpu(g) == expected[g]);
    CHECK(topology.host_to_gpu(g).size() == 3);
  }
}
