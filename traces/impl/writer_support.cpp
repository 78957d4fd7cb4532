// The writer's clock and thread defaults.

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "common/errors.hpp"
#include "traces/writer.hpp"

namespace kvtier::traces {

unsigned default_compression_threads() {
  return std::max(1U, std::thread::hardware_concurrency());
}

std::string current_utc_time() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  if (const char* epoch = std::getenv("SOURCE_DATE_EPOCH"); epoch != nullptr && *epoch != '\0') {
    // The convention asks tools to fail on a value they cannot use rather than ignore it.
    constexpr long long kLastSecondOf9999 = 253402300799;
    long long seconds = -1;
    const std::string_view text = epoch;
    const auto parsed = std::from_chars(text.data(), text.data() + text.size(), seconds);
    if (parsed.ec != std::errc() || parsed.ptr != text.data() + text.size() || seconds < 0 ||
        seconds > kLastSecondOf9999) {
      throw ConfigError("SOURCE_DATE_EPOCH '" + std::string(text) +
                            "': expected whole seconds since 1970, up to the end of year 9999",
                        "SOURCE_DATE_EPOCH");
    }
    now = static_cast<std::time_t>(seconds);
  }
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  const std::size_t length = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {text, length};
}

}  // namespace kvtier::traces
