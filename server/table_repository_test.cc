#include "table_repository.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "safetensors.h"

namespace posenc::server {
namespace {

std::filesystem::path TempDir() {
  char pattern[] = "/tmp/posenc_tables_XXXXXX";
  const std::filesystem::path dir = mkdtemp(pattern);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void Write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

TEST(TableRepository, LoadsSkipsMalformedAndReloads) {
  const auto dir = TempDir();
  LearnedTable t;
  t.rows = 8;
  t.dim = 4;
  t.values.assign(32, 0.25f);
  Write(dir / "bert.safetensors", SerializeSafetensors({{"position_embeddings", &t}}));
  Write(dir / "broken.safetensors", "not a safetensors file at all");
  Write(dir / "notes.txt", "ignored");

  TableRepository repo(dir.string());
  repo.Reload();
  ASSERT_EQ(repo.List().size(), 1u);
  auto found = repo.Find("bert/position_embeddings");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->rows, 8);
  ASSERT_EQ(repo.skipped().size(), 1u);
  EXPECT_NE(repo.skipped()[0].find("broken.safetensors"), std::string::npos);

  auto missing = repo.Find("gpt2/wpe");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("bert/position_embeddings"), absl::string_view::npos);

  // Reload without restart: a new file appears, the held table survives.
  std::shared_ptr<const LearnedTable> held = *found;
  Write(dir / "gpt2.safetensors", SerializeSafetensors({{"wpe", &t}}));
  std::filesystem::remove(dir / "bert.safetensors");
  repo.Reload();
  EXPECT_TRUE(repo.Find("gpt2/wpe").ok());
  EXPECT_FALSE(repo.Find("bert/position_embeddings").ok());
  EXPECT_EQ(held->values.size(), 32u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace posenc::server
