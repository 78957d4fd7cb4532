#pragma once
// Where this build's source tree and programs are. Only tests/support/paths.cpp is compiled with
// them (as definitions), so no other test file's compile command names a folder of this clone:
// the same sources compile to the same objects in every clone, and a compiler cache can reuse
// them (docs/ARCHITECTURE.md, "Build").

namespace kvtier::test {

// The repository's root folder.
[[nodiscard]] const char* source_dir();
// This build's kvtier program.
[[nodiscard]] const char* kvtier_binary();
// The sentencepiece reference program (tests/kernels/support/spm_reference.cpp); empty when
// the build has no libsentencepiece.
[[nodiscard]] const char* spm_reference_binary();
// The MPI launcher of the MPI library kvtier was built with; empty when it was built without.
[[nodiscard]] const char* mpiexec_binary();

}  // namespace kvtier::test
