#include "configs/locations.hpp"

namespace kvtier::config {
namespace {

bool is_under(std::string_view path, std::string_view prefix) {
  if (prefix.empty()) {
    return true;
  }
  if (path.substr(0, prefix.size()) != prefix) {
    return false;
  }
  return path.size() == prefix.size() || path[prefix.size()] == '.' || path[prefix.size()] == '[';
}

std::string_view parent_path(std::string_view path) {
  const size_t cut = path.find_last_of(".[");
  return cut == std::string_view::npos ? std::string_view{} : path.substr(0, cut);
}

}  // namespace

std::string describe(const SourcePosition& position) {
  if (position.line <= 0) {
    return position.file;
  }
  return position.file + ":" + std::to_string(position.line) + ":" +
         std::to_string(position.column);
}

std::string join_path(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) {
    return std::string(name);
  }
  std::string joined(prefix);
  if (!name.empty() && name.front() != '[') {
    joined += '.';
  }
  joined += name;
  return joined;
}

void LocationMap::set(const std::string& path, SourcePosition position) {
  entries_[path] = std::move(position);
}

SourcePosition LocationMap::nearest(std::string_view path) const {
  std::string_view probe = path;
  while (true) {
    if (const auto found = entries_.find(probe); found != entries_.end()) {
      return found->second;
    }
    if (probe.empty()) {
      return SourcePosition{default_file_, 0, 0};
    }
    probe = parent_path(probe);
  }
}

void LocationMap::insert_under(std::string_view prefix, const LocationMap& other) {
  for (const auto& [path, position] : other.entries_) {
    entries_[join_path(prefix, path)] = position;
  }
}

void LocationMap::erase_under(std::string_view prefix) {
  for (auto it = entries_.lower_bound(prefix); it != entries_.end();) {
    if (!is_under(it->first, prefix)) {
      if (it->first.substr(0, prefix.size()) != prefix) {
        break;
      }
      ++it;
      continue;
    }
    it = entries_.erase(it);
  }
}

}  // namespace kvtier::config
