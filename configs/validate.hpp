#pragma once
// Checks a resolved config against the rules its schema declares (required values, ranges,
// list lengths) and the consistency rules no single field can express.

#include <google/protobuf/message.h>

#include <string>
#include <vector>

#include "common/errors.hpp"
#include "configs/locations.hpp"

namespace kvtier::config {

class ConfigLoader;

struct Problem {
  std::string path;  // field the problem is about (or the message holding a missing field)
  std::string what;
};

// Every problem, in field order. `loader` is used to try sweep axes' values on the base run.
[[nodiscard]] std::vector<Problem> validate(const google::protobuf::Message& message,
                                            const ConfigLoader& loader,
                                            const LocationMap& locations);

// A config with one or more problems; prints one line per problem.
class InvalidConfig : public ConfigError {
 public:
  InvalidConfig(const std::vector<Problem>& problems, const LocationMap& locations);
  [[nodiscard]] std::vector<std::string> lines() const override;

 private:
  std::vector<std::string> lines_;
};

namespace detail {
// Rules that relate several fields, dispatched on the message type.
void check_consistency(const google::protobuf::Message& message, const std::string& path,
                       const ConfigLoader& loader, const LocationMap& locations,
                       std::vector<Problem>& problems);
}  // namespace detail

}  // namespace kvtier::config
