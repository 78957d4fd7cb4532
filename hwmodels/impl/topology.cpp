// Boost 1.74's named_graph returns an empty boost::optional that GCC 12, once add_vertex is
// inlined under -O2 with sanitizers, reports as used uninitialized; a false positive in the
// library (the optional is empty and never read).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "hwmodels/topology.hpp"

#include <boost/graph/breadth_first_search.hpp>

#include <algorithm>
#include <stdexcept>

#include "hwmodels/link_math.hpp"

namespace kvtier::hw {

NodeTopology::VertexId NodeTopology::add_vertex(VertexKind kind, std::uint32_t index,
                                                std::string name) {
  return boost::add_vertex(Vertex{kind, index, std::move(name)}, graph_);
}

sim::LinkId NodeTopology::connect(VertexId from, VertexId to, double capacity,
                                  const std::string& name) {
  const sim::LinkId link = network_.add_link(name, capacity);
  boost::add_edge(from, to, Edge{link, capacity}, graph_);
  return link;
}

NodeTopology::NodeTopology(const config::NodeSpec& node, HostMemory host_memory,
                           sim::FlowNetwork& network)
    : network_(network),
      copy_setup_(
          sim::from_microseconds(node.host_link().per_copy_overhead_us(), sim::Rounding::kUp)) {
  const config::HostSpec& host = node.host();
  const config::LinkSpec& link = node.host_link();
  const std::uint32_t sockets = host.sockets();
  const std::uint32_t gpus = node.gpus_per_node();
  const std::uint32_t per_switch = node.gpus_per_pcie_switch();
  const bool pageable = host_memory == HostMemory::kPageable;
  const double down =
      asymptotic_gb_per_s(link, config::H2D) * 1e9 * (pageable ? link.pageable_h2d_factor() : 1.0);
  const double up =
      asymptotic_gb_per_s(link, config::D2H) * 1e9 * (pageable ? link.pageable_d2h_factor() : 1.0);
  const double ddr = host.channels_per_socket() * host.channel_bandwidth_gb_per_s() * 1e9 *
                     host.achievable_bandwidth_fraction();

  for (std::uint32_t s = 0; s < sockets; ++s) {
    memories_.push_back(add_vertex(VertexKind::kHostMemory, s, "ddr" + std::to_string(s)));
    sockets_.push_back(add_vertex(VertexKind::kCpuSocket, s, "socket" + std::to_string(s)));
    connect(memories_[s], sockets_[s], ddr, "ddr" + std::to_string(s) + "->socket");
    connect(sockets_[s], memories_[s], ddr, "socket->ddr" + std::to_string(s));
  }
  for (std::uint32_t a = 0; a < sockets; ++a) {
    for (std::uint32_t b = 0; b < sockets; ++b) {
      if (a != b) {
        connect(sockets_[a], sockets_[b], down * host.remote_socket_h2d_factor(),
                "socket" + std::to_string(a) + "->socket" + std::to_string(b));
      }
    }
  }
  auto couple = [&](sim::LinkId h2d, sim::LinkId d2h) {
    if (link.duplex_h2d_factor() < 1.0 || link.duplex_d2h_factor() < 1.0) {
      network_.couple(h2d, d2h, link.duplex_h2d_factor(), link.duplex_d2h_factor());
    }
  };
  // The switches are spread evenly over the sockets in order, and a GPU's socket is its
  // switch's: a GPU whose host memory sat on another socket than its switch would copy through
  // the inter-socket link, so spreading the GPUs instead made a second socket slow a node down.
  const std::uint32_t switches = (gpus + per_switch - 1) / per_switch;
  VertexId current_switch{};
  std::uint32_t socket = 0;
  for (std::uint32_t g = 0; g < gpus; ++g) {
    if (g % per_switch == 0) {
      const std::uint32_t index = g / per_switch;
      socket = static_cast<std::uint32_t>(std::uint64_t{index} * sockets / switches);
      current_switch = add_vertex(VertexKind::kPcieSwitch, index, "switch" + std::to_string(index));
      const std::string name = "switch" + std::to_string(index);
      couple(connect(sockets_[socket], current_switch, down, "socket->" + name),
             connect(current_switch, sockets_[socket], up, name + "->socket"));
    }
    gpu_socket_.push_back(socket);
    gpus_.push_back(add_vertex(VertexKind::kGpu, g, "gpu" + std::to_string(g)));
    const std::string name = "gpu" + std::to_string(g);
    couple(connect(current_switch, gpus_[g], down, "switch->" + name),
           connect(gpus_[g], current_switch, up, name + "->switch"));
  }
  if (node.gpu_interconnect() == config::NVLINK_SWITCH && gpus > 1) {
    const VertexId fabric = add_vertex(VertexKind::kNvSwitch, 0, "nvswitch");
    const double nvlink = asymptotic_gb_per_s(node.gpu_link(), config::PEER) * 1e9;
    for (std::uint32_t g = 0; g < gpus; ++g) {
      const std::string name = "gpu" + std::to_string(g);
      connect(gpus_[g], fabric, nvlink, name + "->nvswitch");
      connect(fabric, gpus_[g], nvlink, "nvswitch->" + name);
    }
  }
}

std::uint32_t NodeTopology::socket_of_gpu(std::uint32_t gpu) const {
  return gpu_socket_.at(gpu);
}

std::vector<sim::LinkId> NodeTopology::route(VertexId from, VertexId to) const {
  std::vector<VertexId> predecessor(boost::num_vertices(graph_));
  for (VertexId v = 0; v < predecessor.size(); ++v) {
    predecessor[v] = v;
  }
  // An explicit colour map (rather than BFS's default shared two-bit map) keeps the search's
  // state in a plain vector.
  std::vector<boost::default_color_type> colours(boost::num_vertices(graph_));
  boost::breadth_first_search(graph_, from,
                              boost::visitor(boost::make_bfs_visitor(boost::record_predecessors(
                                                 predecessor.data(), boost::on_tree_edge())))
                                  .color_map(boost::make_iterator_property_map(
                                      colours.begin(), boost::get(boost::vertex_index, graph_))));
  if (from != to && predecessor[to] == to) {
    throw std::invalid_argument("no path from " + graph_[from].name + " to " + graph_[to].name);
  }
  std::vector<sim::LinkId> path;
  for (VertexId v = to; v != from; v = predecessor[v]) {
    const auto [edge, found] = boost::edge(predecessor[v], v, graph_);
    path.push_back(graph_[edge].link);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<sim::LinkId> NodeTopology::host_to_gpu(std::uint32_t gpu) const {
  return host_to_gpu(gpu, socket_of_gpu(gpu));
}

std::vector<sim::LinkId> NodeTopology::host_to_gpu(std::uint32_t gpu, std::uint32_t socket) const {
  return route(memories_.at(socket), gpus_.at(gpu));
}

std::vector<sim::LinkId> NodeTopology::gpu_to_host(std::uint32_t gpu) const {
  return route(gpus_.at(gpu), memories_.at(socket_of_gpu(gpu)));
}

std::vector<sim::LinkId> NodeTopology::gpu_to_gpu(std::uint32_t from, std::uint32_t to) const {
  return route(gpus_.at(from), gpus_.at(to));
}

}  // namespace kvtier::hw

#pragma GCC diagnostic pop
