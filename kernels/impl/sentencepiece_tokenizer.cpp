// sentencepiece tokenizer.model files, read with the project's own copy of the model schema and
// segmented by the BPE algorithm in score_bpe.cpp. Debian's libsentencepiece is not linked here:
// it carries and exports its own protobuf 3.14 runtime, which cannot share a process with the
// system protobuf the configs use (each aborts or crashes in the other's code). The tests check
// this implementation against libsentencepiece run in a separate process.
#include <fstream>
#include <sstream>
#include <string>

#include "common/errors.hpp"
#include "kernels/impl/score_bpe.hpp"
#include "kernels/schema/sentencepiece_model.pb.h"
#include "kernels/tokenizer.hpp"

namespace kvtier::kernels {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, sentencepiece's space

struct NormalizerSettings {
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(ScoredVocabulary vocabulary, NormalizerSettings normalizer,
                         std::vector<std::int32_t> control_ids, std::optional<std::int32_t> bos,
                         std::optional<std::int32_t> eos)
      : vocabulary_(std::move(vocabulary)),
        normalizer_(normalizer),
        control_ids_(std::move(control_ids)),
        bos_(bos),
        eos_(eos) {}

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const override {
    return vocabulary_.encode(normalize(text));
  }
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const override {
    return decode_scored_pieces(vocabulary_, ids, control_ids_,
                                normalizer_.escape_whitespaces ? kSpaceMarker : "",
                                normalizer_.add_dummy_prefix);
  }
  [[nodiscard]] int vocab_size() const override { return static_cast<int>(vocabulary_.size()); }
  [[nodiscard]] std::optional<std::int32_t> bos_id() const override { return bos_; }
  [[nodiscard]] std::optional<std::int32_t> eos_id() const override { return eos_; }
  [[nodiscard]] std::string_view kind() const override { return "sentencepiece"; }

 private:
  // The identity normaliser with sentencepiece's whitespace handling: optionally trim and
  // collapse runs of spaces, prefix one space, and spell spaces as U+2581.
  [[nodiscard]] std::string normalize(std::string_view text) const {
    std::string spaced;
    if (normalizer_.remove_extra_whitespaces) {
      bool pending_space = false;
      for (const char c : text) {
        if (c == ' ') {
          pending_space = !spaced.empty();
          continue;
        }
        if (pending_space) {
          spaced += ' ';
          pending_space = false;
        }
        spaced += c;
      }
    } else {
      spaced = text;
    }
    if (spaced.empty()) {
      return {};
    }
    if (normalizer_.add_dummy_prefix) {
      spaced.insert(spaced.begin(), ' ');
    }
    if (!normalizer_.escape_whitespaces) {
      return spaced;
    }
    std::string escaped;
    for (const char c : spaced) {
      if (c == ' ') {
        escaped += kSpaceMarker;
      } else {
        escaped += c;
      }
    }
    return escaped;
  }

  ScoredVocabulary vocabulary_;
  NormalizerSettings normalizer_;
  std::vector<std::int32_t> control_ids_;
  std::optional<std::int32_t> bos_;
  std::optional<std::int32_t> eos_;
};

std::optional<std::int32_t> valid_id(std::int32_t id, int size) {
  if (id < 0 || id >= size) {
    return std::nullopt;
  }
  return id;
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::filesystem::path& path) {
  const std::string where = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError("cannot open tokenizer", where);
  }
  spm::ModelProto model;
  if (!model.ParseFromIstream(&in)) {
    throw DataError("not a sentencepiece model (protobuf parse failed)", where);
  }
  // An empty message parses too (as a UNIGRAM model of nothing).
  if (model.pieces_size() == 0) {
    throw DataError("not a sentencepiece model (no pieces)", where);
  }
  if (model.trainer_spec().model_type() != spm::TrainerSpec::BPE) {
    throw DataError("sentencepiece model_type " +
                        spm::TrainerSpec::ModelType_Name(model.trainer_spec().model_type()) +
                        " is not supported (only BPE, as in Llama 2, Mistral and TinyLlama)",
                    where);
  }
  if (model.trainer_spec().treat_whitespace_as_suffix()) {
    throw DataError(
        "sentencepiece treat_whitespace_as_suffix is not supported (whitespace as a prefix only)",
        where);
  }
  const spm::NormalizerSpec& spec = model.normalizer_spec();
  if (!spec.precompiled_charsmap().empty()) {
    throw DataError("sentencepiece normalizer '" + spec.name() +
                        "' with a precompiled character map is not supported (only identity)",
                    where);
  }
  ScoredVocabulary vocabulary;
  std::vector<std::int32_t> control_ids;
  std::optional<std::int32_t> unknown_id;
  for (int id = 0; id < model.pieces_size(); ++id) {
    const auto& piece = model.pieces(id);
    using Piece = spm::ModelProto::SentencePiece;
    vocabulary.add(piece.piece(), piece.score(), piece.type() == Piece::NORMAL);
    if (piece.type() == Piece::USER_DEFINED) {
      vocabulary.add_user_defined(id);
    } else if (piece.type() == Piece::CONTROL) {
      control_ids.push_back(id);
    } else if (piece.type() == Piece::UNKNOWN) {
      unknown_id = id;
    }
  }
  // Text the pieces cannot spell encodes as <unk>; without one that would be id 0 of a
  // vocabulary that may not have it (libsentencepiece refuses such a model too).
  if (!unknown_id) {
    throw DataError("sentencepiece model has no <unk> piece (a piece of type UNKNOWN)", where);
  }
  vocabulary.finish(*unknown_id);
  const NormalizerSettings normalizer{spec.add_dummy_prefix(), spec.remove_extra_whitespaces(),
                                      spec.escape_whitespaces()};
  const int size = model.pieces_size();
  return std::make_unique<SentencePieceTokenizer>(
      std::move(vocabulary), normalizer, std::move(control_ids),
      valid_id(model.trainer_spec().bos_id(), size), valid_id(model.trainer_spec().eos_id(), size));
}

}  // namespace kvtier::kernels
