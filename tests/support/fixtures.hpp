#pragma once
// Where the tests find the stories260K fixture: ../shared/fixtures/stories260K beside the
// repository, or under $KVTIER_FIXTURES when that is set (test programs run away from their
// source tree, e.g. from a bundle built by scripts/gpu-bundle.sh).

#include <cstdlib>
#include <filesystem>

#include "tests/support/paths.hpp"

namespace kvtier::test {

inline std::filesystem::path stories_dir() {
  if (const char* fixtures = std::getenv("KVTIER_FIXTURES");
      fixtures != nullptr && *fixtures != '\0') {
    return std::filesystem::path(fixtures) / "stories260K";
  }
  return std::filesystem::path(kvtier::test::source_dir()) / ".." / "shared" / "fixtures" /
         "stories260K";
}

}  // namespace kvtier::test
