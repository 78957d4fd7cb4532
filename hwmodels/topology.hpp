#pragma once
// A node's data paths as a directed graph (Boost.Graph): host memory per socket, CPU sockets,
// PCIe switches, GPUs and the NVSwitch fabric. Each directed edge is a link of a
// sim::FlowNetwork, so a transfer routed over its path shares bandwidth on every edge it
// crosses: two GPUs behind one PCIe switch contend for its uplink, and memory on the far socket
// is reached through the inter-socket link.
//
// Layout: consecutive groups of gpus_per_pcie_switch GPUs share one switch; the switches are
// spread evenly over the sockets in order, and a GPU's host memory is on its switch's socket.
// Capacities per direction: DDR at its achievable bandwidth; inter-socket at the host link's
// bandwidth times remote_socket_h2d_factor (REFERENCE.md §3: far-socket memory cuts H2D ~3x);
// switch uplinks and GPU links at the host link's large-copy bandwidth (pinned, or times the
// pageable factor); NVLink at its measured PEER bandwidth. PCIe directions are coupled by the
// link's duplex factors.

#include <boost/graph/adjacency_list.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "configs/schema/hardware.pb.h"
#include "sim/flow_network.hpp"
#include "sim/tick.hpp"

namespace kvtier::hw {

enum class HostMemory { kPinned, kPageable };

class NodeTopology {
 public:
  enum class VertexKind { kHostMemory, kCpuSocket, kPcieSwitch, kGpu, kNvSwitch };

  struct Vertex {
    VertexKind kind;
    std::uint32_t index;
    std::string name;
  };
  struct Edge {
    sim::LinkId link;
    double capacity_bytes_per_s;
  };
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, Vertex, Edge>;
  using VertexId = Graph::vertex_descriptor;

  NodeTopology(const config::NodeSpec& node, HostMemory host_memory, sim::FlowNetwork& network);

  [[nodiscard]] const Graph& graph() const noexcept { return graph_; }
  [[nodiscard]] std::uint32_t gpu_count() const noexcept {
    return static_cast<std::uint32_t>(gpus_.size());
  }
  [[nodiscard]] std::uint32_t socket_of_gpu(std::uint32_t gpu) const;
  [[nodiscard]] VertexId gpu(std::uint32_t index) const { return gpus_.at(index); }
  [[nodiscard]] VertexId host_memory(std::uint32_t socket) const { return memories_.at(socket); }

  // Fewest-hop path as flow-network links; ties go to the lower-numbered vertex, so routes are
  // deterministic. Throws std::invalid_argument when `to` cannot be reached.
  [[nodiscard]] std::vector<sim::LinkId> route(VertexId from, VertexId to) const;
  // Host memory on the GPU's own socket (or on `socket`) to the GPU, and back.
  [[nodiscard]] std::vector<sim::LinkId> host_to_gpu(std::uint32_t gpu) const;
  [[nodiscard]] std::vector<sim::LinkId> host_to_gpu(std::uint32_t gpu, std::uint32_t socket) const;
  [[nodiscard]] std::vector<sim::LinkId> gpu_to_host(std::uint32_t gpu) const;
  [[nodiscard]] std::vector<sim::LinkId> gpu_to_gpu(std::uint32_t from, std::uint32_t to) const;

  // The setup cost every host copy pays (the host link's per-copy overhead).
  [[nodiscard]] sim::Tick copy_setup() const noexcept { return copy_setup_; }

 private:
  VertexId add_vertex(VertexKind kind, std::uint32_t index, std::string name);
  sim::LinkId connect(VertexId from, VertexId to, double capacity, const std::string& name);

  sim::FlowNetwork& network_;
  Graph graph_;
  std::vector<VertexId> memories_;
  std::vector<VertexId> sockets_;
  std::vector<VertexId> gpus_;
  std::vector<std::uint32_t> gpu_socket_;
  sim::Tick copy_setup_;
};

}  // namespace kvtier::hw
