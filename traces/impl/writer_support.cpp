// The writer's temporary file, clock and thread defaults.

#include "traces/impl/temporary_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string>
#include <system_error>
#include <thread>

#include "traces/writer.hpp"

namespace kvtier::traces {

TemporaryFile::TemporaryFile(const std::filesystem::path& final_path)
    : path_(final_path.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()))) {}

TemporaryFile::~TemporaryFile() {
  if (!released_) {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
}

unsigned default_compression_threads() {
  return std::max(1U, std::thread::hardware_concurrency());
}

std::string current_utc_time() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  if (const char* epoch = std::getenv("SOURCE_DATE_EPOCH"); epoch != nullptr && *epoch != '\0') {
    char* end = nullptr;
    const long long seconds = std::strtoll(epoch, &end, 10);
    if (end != nullptr && *end == '\0' && seconds >= 0) {
      now = static_cast<std::time_t>(seconds);
    }
  }
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  const std::size_t length = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {text, length};
}

}  // namespace kvtier::traces
