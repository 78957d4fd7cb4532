// The tiered cache's bookkeeping (kernels/tier_book.hpp), shared by the CPU and CUDA backends:
// no two tokens ever hold one slot, a slot freed by a plan's phase is not handed out again in
// that phase (the CUDA backend runs a phase's moves grouped by kind, in any order), staging plans
// read every held position from where its data is — also as the CUDA backend encodes them for
// the device (kernels/device_plan.hpp) — and the byte counts follow the moves.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "kernels/device_plan.hpp"
#include "kernels/impl/kv_quantise.hpp"
#include "kernels/tier_book.hpp"
#include "replay/compressed_format.hpp"

namespace {

namespace kk = kvtier::kernels;
using kvtier::replay::Tier;

constexpr std::uint64_t kTokenBytes = 64;
constexpr std::uint64_t kCompressedBytes = 24;

// Who holds each slot of each tier (T0, T1, T2, staging), as the moves say.
struct Owners {
  std::map<std::pair<int, std::uint32_t>, std::pair<std::uint32_t, std::uint64_t>> slots;

  void take(int pool, std::uint32_t slot, std::uint32_t layer, std::uint64_t position) {
    const auto [it, inserted] = slots.try_emplace({pool, slot}, layer, position);
    INFO("pool " << pool << " slot " << slot << " taken by layer " << layer << " position "
                 << position << ", held by layer " << it->second.first << " position "
                 << it->second.second);
    REQUIRE(inserted);
  }
  void give(int pool, std::uint32_t slot, std::uint32_t layer, std::uint64_t position) {
    const auto it = slots.find({pool, slot});
    REQUIRE(it != slots.end());
    REQUIRE(it->second == std::make_pair(layer, position));
    slots.erase(it);
  }
};

int pool_of(Tier tier) {
  return static_cast<int>(tier);
}

// Checks one phase: slots freed and slots taken are disjoint per tier; ownership follows.
void check_phase(const std::vector<kk::TokenMove>& moves, Owners& owners) {
  std::set<std::pair<int, std::uint32_t>> freed;
  std::set<std::pair<int, std::uint32_t>> taken;
  for (const kk::TokenMove& move : moves) {
    REQUIRE(move.from != move.to);
    freed.insert({pool_of(move.from), move.from_slot});
    if (move.to != Tier::kEvicted) {
      taken.insert({pool_of(move.to), move.to_slot});
    }
  }
  for (const auto& slot : taken) {
    INFO("pool " << slot.first << " slot " << slot.second << " freed and taken in one phase");
    REQUIRE(freed.count(slot) == 0);
  }
  for (const kk::TokenMove& move : moves) {
    owners.give(pool_of(move.from), move.from_slot, move.layer, move.position);
  }
  for (const kk::TokenMove& move : moves) {
    if (move.to != Tier::kEvicted) {
      owners.take(pool_of(move.to), move.to_slot, move.layer, move.position);
    }
  }
}

}  // namespace

TEST_CASE("the tier book never gives one slot to two tokens, nor reuses a slot within a phase",
          "[kernels][live][tier_book]") {
  // Host slots from their pools, and at their homes (60 positions: exactly enough).
  for (const auto& [prefetch, host_positions] :
       {std::pair{kk::PrefetchMode::kFull, std::uint64_t{0}},
        std::pair{kk::PrefetchMode::kDifferential, std::uint64_t{0}},
        std::pair{kk::PrefetchMode::kFull, std::uint64_t{60}},
        std::pair{kk::PrefetchMode::kDifferential, std::uint64_t{60}}}) {
    CAPTURE(host_positions);
    constexpr int kLayers = 3;
    // The placement keeps at most 40 token-layers in T0; each step appends one per layer.
    kk::TierBook book(kLayers, (40 + kLayers) * kTokenBytes, kTokenBytes, kCompressedBytes,
                      prefetch, host_positions);
    Owners owners;
    std::mt19937 random(11);
    std::uint64_t promoted = 0;
    std::uint64_t offloaded_full = 0;
    std::uint64_t offloaded_compressed = 0;
    // Differential: the staging slot each T1 token was staged into.
    std::map<std::pair<int, std::uint64_t>, std::uint32_t> staged;
    // What each staging slot holds on the device, as the plans' copies left it.
    std::map<std::uint64_t, std::pair<std::uint32_t, std::uint64_t>> staging_content;
    constexpr int kStaging = 3;
    kk::StagePlan stage;  // reused, as the backends do: each plan must start afresh
    for (std::uint64_t position = 0; position < 60; ++position) {
      for (int l = 0; l < kLayers; ++l) {
        const std::uint32_t slot = book.append(l, position);
        owners.take(pool_of(Tier::kHbm), slot, static_cast<std::uint32_t>(l), position);
      }
      // A new placement: random moves among held tokens, at most 40 in T0 per the budget.
      std::uint64_t in_t0 = 0;
      for (int l = 0; l < kLayers; ++l) {
        auto& placement = book.placement()[static_cast<std::size_t>(l)];
        for (std::uint64_t p = 0; p < placement.size(); ++p) {
          if (placement.tier(p) == Tier::kEvicted) {
            continue;
          }
          const auto choice = random() % 10;
          Tier to = placement.tier(p);
          if (choice < 3) {
            to = static_cast<Tier>(random() % 3);
          } else if (choice == 3) {
            to = Tier::kEvicted;
          }
          if (to == Tier::kHbm && in_t0 >= 40) {
            to = Tier::kHost;
          }
          in_t0 += to == Tier::kHbm ? 1 : 0;
          if (to != placement.tier(p)) {
            placement.move(p, to);
          }
        }
      }
      const kk::MovePlan plan = book.plan_moves();
      for (const kk::TokenMove& move : plan.demotions) {
        REQUIRE(move.to != Tier::kHbm);
        if (move.from == Tier::kHbm) {
          offloaded_full += move.to == Tier::kHost ? 1 : 0;
          offloaded_compressed += move.to == Tier::kCompressed ? 1 : 0;
        }
        if (move.from == Tier::kHost) {
          const auto it = staged.find({static_cast<int>(move.layer), move.position});
          if (it != staged.end()) {
            owners.give(kStaging, it->second, move.layer, move.position);
            staged.erase(it);
          }
        }
      }
      if (host_positions > 0) {
        // A host token-layer is at its home.
        for (const kk::TokenMove& move : plan.demotions) {
          if (move.to == Tier::kHost || move.to == Tier::kCompressed) {
            REQUIRE(move.to_slot == move.layer * host_positions + move.position);
          }
        }
      }
      check_phase(plan.demotions, owners);
      for (const kk::TokenMove& move : plan.promotions) {
        REQUIRE(move.to == Tier::kHbm);
        REQUIRE(move.from != Tier::kHbm);
        const auto it = staged.find({static_cast<int>(move.layer), move.position});
        if (it != staged.end()) {
          owners.give(kStaging, it->second, move.layer, move.position);
          staged.erase(it);
        }
      }
      check_phase(plan.promotions, owners);
      promoted += plan.promotions.size();
      // Every layer's placement is now where its data is; each stage reads it from there.
      for (int l = 0; l < kLayers; ++l) {
        const auto& placement = book.placement()[static_cast<std::size_t>(l)];
        book.plan_stage(l, placement.size(), stage);
        REQUIRE(stage.reads.size() == placement.size());
        std::uint64_t transient_t1 = 0;
        for (std::uint64_t p = 0; p < placement.size(); ++p) {
          const kk::ReadSlot read = stage.reads[p];
          switch (placement.tier(p)) {
            case Tier::kHbm: REQUIRE(read.kind == kk::ReadSlot::Kind::kT0); break;
            case Tier::kHost:
              if (prefetch == kk::PrefetchMode::kFull) {
                REQUIRE(read.kind == kk::ReadSlot::Kind::kTransient);
                ++transient_t1;
              } else {
                REQUIRE(read.kind == kk::ReadSlot::Kind::kStaged);
              }
              break;
            case Tier::kCompressed: REQUIRE(read.kind == kk::ReadSlot::Kind::kTransient); break;
            case Tier::kEvicted: REQUIRE(read.kind == kk::ReadSlot::Kind::kNone); break;
          }
        }
        REQUIRE(stage.transient_entries == transient_t1 + stage.t2_reads.size());
        // The device's view of it (kernels/device_plan.hpp): fill staging as the pairs say, then
        // every position read through the page table finds its own token. Transient entries
        // come after every kept copy, as in the CUDA backend.
        std::vector<std::uint32_t> words(placement.size() +
                                         2 * (stage.t1_copies.size() + stage.t2_reads.size()));
        const kk::DevicePlanSize size =
            kk::write_device_plan(stage, book.staging_capacity(), prefetch, words.data());
        REQUIRE(size.words() == words.size());
        const std::uint32_t* pair = words.data() + size.positions;
        for (std::uint64_t i = 0; i < size.t1_copies + size.t2_reads; ++i, pair += 2) {
          const int pool = i < size.t1_copies ? pool_of(Tier::kHost) : pool_of(Tier::kCompressed);
          staging_content[pair[1]] = owners.slots.at({pool, pair[0]});
        }
        for (std::uint64_t p = 0; p < placement.size(); ++p) {
          std::int32_t entry = 0;
          std::memcpy(&entry, &words[p], sizeof(entry));
          const std::pair<std::uint32_t, std::uint64_t> self{static_cast<std::uint32_t>(l), p};
          CAPTURE(l, p, entry);
          if (entry >= 0) {
            REQUIRE(owners.slots.at({pool_of(Tier::kHbm), static_cast<std::uint32_t>(entry)}) ==
                    self);
          } else if (entry == -1) {
            REQUIRE(placement.tier(p) == Tier::kEvicted);
          } else {
            REQUIRE(staging_content.at(kk::staging_slot(entry)) == self);
          }
        }
        REQUIRE(stage.t2_reads.size() == placement.count(Tier::kCompressed));
        if (prefetch == kk::PrefetchMode::kFull) {
          REQUIRE(stage.t1_copies.size() == placement.count(Tier::kHost));
        } else {
          // Only tokens never staged since they entered T1 are copied; each once.
          for (const kk::SlotCopy& copy : stage.t1_copies) {
            std::uint64_t reader = 0;
            while (stage.reads[reader].kind != kk::ReadSlot::Kind::kStaged ||
                   stage.reads[reader].index != copy.to) {
              ++reader;
            }
            REQUIRE(staged.count({l, reader}) == 0);
            staged[{l, reader}] = copy.to;
            owners.take(kStaging, copy.to, static_cast<std::uint32_t>(l), reader);
          }
          REQUIRE(book.unstaged_t1_tokens(l) == 0);
        }
      }
    }
    const kk::TieredCacheStats& stats = book.stats();
    REQUIRE(stats.h2d_promote.tokens == promoted);
    REQUIRE(stats.d2h_offload.tokens == offloaded_full + offloaded_compressed);
    REQUIRE(stats.d2h_offload.bytes ==
            offloaded_full * kTokenBytes + offloaded_compressed * kCompressedBytes);
    REQUIRE(stats.h2d_prefetch.bytes == stats.h2d_prefetch.tokens * kTokenBytes);
    REQUIRE(stats.h2d_compressed.bytes == stats.h2d_compressed.tokens * kCompressedBytes);
    // Every copied token-layer is in one contiguous piece, and every piece holds one or more.
    for (const kk::CopyCounter* counter :
         {&stats.h2d_prefetch, &stats.h2d_compressed, &stats.h2d_promote, &stats.d2h_offload,
          &stats.host_recode}) {
      REQUIRE(counter->runs <= counter->tokens);
      REQUIRE((counter->runs > 0) == (counter->tokens > 0));
    }
    REQUIRE(stats.t0_peak_bytes <= 40 * kTokenBytes + kLayers * kTokenBytes);
    REQUIRE(book.t0_capacity() <= 40 + kLayers);
  }
}

TEST_CASE("with host homes a layer's T1 tokens stage as one run per run of T1 positions",
          "[kernels][live][tier_book]") {
  // Layer 1 of 12 positions: 0-7 go to T1 and come back, which leaves the pool's free list
  // in release order; then T1 takes 2-4 and 6-9, and T2 takes 10. At their homes they stage as
  // two contiguous runs; from the pool, the last freed slot first, as seven single slots.
  constexpr std::uint64_t kPositions = 12;
  for (const std::uint64_t host_positions : {std::uint64_t{0}, kPositions}) {
    CAPTURE(host_positions);
    kk::TierBook book(2, 2 * kPositions * kTokenBytes, kTokenBytes, kCompressedBytes,
                      kk::PrefetchMode::kFull, host_positions);
    for (std::uint64_t p = 0; p < kPositions; ++p) {
      for (int l = 0; l < 2; ++l) {
        static_cast<void>(book.append(l, p));
      }
    }
    auto& placement = book.placement()[1];
    const auto move_all = [&](std::initializer_list<std::uint64_t> positions, Tier to) {
      for (const std::uint64_t p : positions) {
        placement.move(p, to);
      }
      static_cast<void>(book.plan_moves());
    };
    move_all({0, 1, 2, 3, 4, 5, 6, 7}, Tier::kHost);
    move_all({0, 1, 2, 3, 4, 5, 6, 7}, Tier::kHbm);
    for (const std::uint64_t p : {2, 3, 4, 6, 7, 8, 9}) {
      placement.move(p, Tier::kHost);
    }
    move_all({10}, Tier::kCompressed);
    kk::StagePlan stage;
    book.plan_stage(1, kPositions, stage);
    REQUIRE(stage.t1_copies.size() == 7);
    std::size_t runs = 0;
    for (std::size_t i = 0; i < stage.t1_copies.size(); ++i) {
      const bool joins = i > 0 &&
                         stage.t1_copies[i].from_slot == stage.t1_copies[i - 1].from_slot + 1 &&
                         stage.t1_copies[i].to == stage.t1_copies[i - 1].to + 1;
      runs += joins ? 0 : 1;
    }
    // The book counts the same pieces. Layer 1's T0 slots are every other one (the layers
    // append in turn) and come back in reverse order, so none of its moves to or from T0 join:
    // 8 + 7 offloads to T1 and 1 to T2, 8 promotions.
    CHECK(book.stats().h2d_prefetch.runs == runs);
    CHECK(book.stats().h2d_compressed.runs == 1);
    CHECK(book.stats().d2h_offload.runs == 16);
    CHECK(book.stats().h2d_promote.runs == 8);
    if (host_positions > 0) {
      CHECK(runs == 2);
      CHECK(stage.t1_copies.front().from_slot == kPositions + 2);  // layer 1, position 2
      CHECK(stage.t2_reads.front().from_slot == kPositions + 10);
      CHECK(book.t1_capacity() == kPositions + 10);  // the highest home taken, plus one
    } else {
      CHECK(runs == 7);
    }
  }
  // Homes past 32-bit slots, or a position past the homes, are refused.
  CHECK_THROWS_AS(kk::TierBook(2, kTokenBytes, kTokenBytes, kCompressedBytes,
                               kk::PrefetchMode::kFull, std::uint64_t{1} << 31U),
                  kvtier::ConfigError);
  kk::TierBook small(1, 4 * kTokenBytes, kTokenBytes, kCompressedBytes, kk::PrefetchMode::kFull, 2);
  for (std::uint64_t p = 0; p < 3; ++p) {
    static_cast<void>(small.append(0, p));
  }
  small.placement()[0].move(2, Tier::kHost);
  CHECK_THROWS_AS(small.plan_moves(), std::logic_error);
}

TEST_CASE("the tier book keeps T0 to its budget", "[kernels][live][tier_book]") {
  REQUIRE_THROWS_AS(
      kk::TierBook(2, kTokenBytes - 1, kTokenBytes, kCompressedBytes, kk::PrefetchMode::kFull),
      kvtier::ConfigError);
  kk::TierBook book(2, 3 * kTokenBytes + 5, kTokenBytes, kCompressedBytes, kk::PrefetchMode::kFull);
  REQUIRE(book.t0_limit() == 3);
  static_cast<void>(book.append(0, 0));
  static_cast<void>(book.append(1, 0));
  static_cast<void>(book.append(0, 1));
  REQUIRE_THROWS_AS(book.append(1, 1), kvtier::ConfigError);
  // Offloading one makes room for a promotion, not for two.
  book.placement()[0].move(0, Tier::kHost);
  static_cast<void>(book.plan_moves());
  static_cast<void>(book.append(1, 1));
  book.placement()[0].move(0, Tier::kHbm);
  REQUIRE_THROWS_AS(book.plan_moves(), kvtier::ConfigError);
}

TEST_CASE("the cache's T2 token-layer is the size the simulator books",
          "[kernels][live][tier_book]") {
  // kernels/impl/kv_quantise.hpp against replay/compressed_format.hpp, for several shapes.
  for (const auto& [kv_heads, head_dim] : {std::pair{4, 8}, std::pair{8, 128}, std::pair{2, 64}}) {
    CHECK(static_cast<double>(kvtier::kernels::quantise::compressed_bytes(kv_heads, head_dim)) ==
          kvtier::replay::kInt8HeadScaled.token_layer_bytes(kv_heads, head_dim));
  }
}
