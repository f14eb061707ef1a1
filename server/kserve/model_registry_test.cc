#include "kserve/model_registry.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kserve/model_file.h"

namespace posenc::server::kserve {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

constexpr char kRope[] = R"({"operation": "rope", "parameters": {"base": 500000}})";

class ModelRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/posenc_models_XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ModelRepositoryOptions Options() {
    ModelRepositoryOptions o;
    o.dir = dir_.string();
    return o;
  }

  static std::vector<std::string> Names(const ModelSet& set) {
    std::vector<std::string> names;
    for (const auto& m : set.models()) names.push_back(m->name);
    return names;
  }

  // The reason a skipped file of that model name gave ("" if none).
  static std::string Reason(const ModelSet& set, const std::string& name) {
    const SkippedModel* s = set.FindSkipped(name);
    return s == nullptr ? "" : s->reason;
  }

  fs::path dir_;
};

TEST_F(ModelRegistryTest, NoDirectoryServesTheBuiltIns) {
  ModelRegistry r(ModelRepositoryOptions{});
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_EQ(Names(*r.Snapshot()), (std::vector<std::string>{"rope", "rope_qk", "sinusoidal",
                                                            "learned", "attention_bias"}));
  EXPECT_TRUE(r.Snapshot()->skipped().empty());
}

TEST_F(ModelRegistryTest, BadFilesAreSkippedWithTheirReasonWhileGoodOnesLoad) {
  Write(dir_ / "good.json", kRope);
  Write(dir_ / "typo.json", R"({"operation": "rope", "parameters": {"bsae": 1}})");
  Write(dir_ / "broken.json", "{not json");
  Write(dir_ / "rope.json", kRope);  // a built-in's name
  Write(dir_ / "bad name.json", kRope);
  Write(dir_ / "huge.json", std::string(kMaxModelFileBytes + 1, ' '));
  Write(dir_ / "notes.txt", "not a model file: ignored");
  fs::create_directory(dir_ / "dir.json");
  ASSERT_EQ(mkfifo((dir_ / "fifo.json").c_str(), 0600), 0);  // must not block the reload
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  std::shared_ptr<const ModelSet> set = r.Snapshot();
  EXPECT_EQ(Names(*set), (std::vector<std::string>{"rope", "rope_qk", "sinusoidal", "learned",
                                                   "attention_bias", "good"}));
  EXPECT_NE(Reason(*set, "typo").find("no parameter \"bsae\""), std::string::npos);
  EXPECT_NE(Reason(*set, "typo").find("typo.json"), std::string::npos);
  EXPECT_NE(Reason(*set, "broken").find("not a JSON object"), std::string::npos);
  EXPECT_NE(Reason(*set, "rope").find("built-in"), std::string::npos);
  EXPECT_NE(Reason(*set, "bad name").find("model name"), std::string::npos);
  EXPECT_NE(Reason(*set, "huge").find("over the limit"), std::string::npos);
  EXPECT_NE(Reason(*set, "dir").find("not a regular file"), std::string::npos);
  EXPECT_NE(Reason(*set, "fifo").find("FIFO"), std::string::npos);
  EXPECT_EQ(set->skipped().size(), 7u);
  // A lookup of a skipped model says why it is not there.
  absl::StatusOr<std::shared_ptr<const Model>> typo = set->Find("typo", "");
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(typo.status().message().find("bsae"), std::string::npos) << typo.status();
  EXPECT_TRUE(set->Find("good", "1").ok());
  EXPECT_EQ(set->Find("good", "2").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelRegistryTest, ReloadSwapsWhileHeldModelsStay) {
  Write(dir_ / "a.json", kRope);
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  std::shared_ptr<const ModelSet> before = r.Snapshot();
  absl::StatusOr<std::shared_ptr<const Model>> held = before->Find("a", "");
  ASSERT_TRUE(held.ok());
  // Change a, remove nothing, add b; then remove a.
  Write(dir_ / "a.json", R"({"operation": "rope", "parameters": {"base": 10000}})");
  Write(dir_ / "b.json", R"({"operation": "sinusoidal"})");
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_EQ(r.Snapshot()->Find("a", "").value()->fixed.at("base").int64_param(), 10000);
  EXPECT_TRUE(r.Snapshot()->Find("b", "").ok());
  fs::remove(dir_ / "a.json");
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_EQ(r.Snapshot()->Find("a", "").status().code(), absl::StatusCode::kNotFound);
  // What a call took before the reloads is unchanged.
  EXPECT_EQ((*held)->fixed.at("base").int64_param(), 500000);
  EXPECT_TRUE(before->Find("a", "").ok());
  EXPECT_FALSE(before->Find("b", "").ok());
}

TEST_F(ModelRegistryTest, LookupsDuringReloadsSeeOneWholeSet) {
  Write(dir_ / "a.json", kRope);
  Write(dir_ / "b.json", kRope);
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  std::atomic<bool> stop{false};
  std::atomic<int> lookups{0}, torn{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        std::shared_ptr<const ModelSet> set = r.Snapshot();
        // Both files are rewritten together between reloads: a set has both
        // or neither changed, never one of each.
        auto a = set->Find("a", ""), b = set->Find("b", "");
        if (!a.ok() || !b.ok() ||
            (*a)->fixed.at("base").int64_param() != (*b)->fixed.at("base").int64_param()) {
          torn.fetch_add(1);
        }
        lookups.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 50; ++i) {
    const std::string json =
        R"({"operation": "rope", "parameters": {"base": )" + std::to_string(1000 + i) + "}}";
    Write(dir_ / "a.json", json);
    Write(dir_ / "b.json", json);
    ASSERT_TRUE(r.Reload().ok());
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0) << "of " << lookups.load() << " lookups";
  EXPECT_EQ(r.Snapshot()->Find("a", "").value()->fixed.at("base").int64_param(), 1049);
}

TEST_F(ModelRegistryTest, UnloadTakesAModelOutUntilALoadNamesIt) {
  Write(dir_ / "a.json", kRope);
  Write(dir_ / "b.json", kRope);
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  absl::StatusOr<std::shared_ptr<const Model>> held = r.Snapshot()->Find("a", "");
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(r.Unload("a").value_or(false));
  auto out = [&] {
    std::shared_ptr<const ModelSet> set = r.Snapshot();
    const absl::Status s = set->Find("a", "").status();
    return absl::IsNotFound(s) && absl::StrContains(s.message(), ModelRegistry::kUnloaded) &&
           absl::StrContains(Reason(*set, "a"), ModelRegistry::kUnloaded) &&
           set->Find("b", "").ok();
  };
  EXPECT_TRUE(out()) << r.Snapshot()->Find("a", "").status();
  // Rescans leave it out, and so does a load of another model.
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_TRUE(out());
  ASSERT_TRUE(r.Reload({}, "b").ok());
  EXPECT_TRUE(out());
  // Unloaded again: nothing more.
  ASSERT_TRUE(r.Unload("a").ok());
  EXPECT_FALSE(*r.Unload("a"));
  EXPECT_TRUE(out());
  EXPECT_EQ(r.Snapshot()->skipped().size(), 1u);
  // A load of it brings it back, from its file as it is now.
  Write(dir_ / "a.json", R"({"operation": "rope", "parameters": {"base": 10000}})");
  ASSERT_TRUE(r.Reload({}, "a").ok());
  EXPECT_EQ(r.Snapshot()->Find("a", "").value()->fixed.at("base").int64_param(), 10000);
  EXPECT_EQ(Reason(*r.Snapshot(), "a"), "");
  // What a call held throughout is unchanged.
  EXPECT_EQ((*held)->fixed.at("base").int64_param(), 500000);
}

TEST_F(ModelRegistryTest, UnloadOfWhatIsNotLoadedChangesNothing) {
  Write(dir_ / "a.json", kRope);
  Write(dir_ / "bad.json", "{");
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  std::shared_ptr<const ModelSet> before = r.Snapshot();
  const std::string bad_reason = Reason(*before, "bad");
  ASSERT_NE(bad_reason, "");
  EXPECT_TRUE(r.Unload("nope").ok());
  EXPECT_TRUE(r.Unload("bad").ok());
  EXPECT_FALSE(r.Unload("nope").value_or(true));
  const absl::Status built_in = r.Unload("rope").status();
  EXPECT_EQ(built_in.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(built_in.message(), "rope is built in")) << built_in;
  EXPECT_EQ(r.Snapshot(), before);
  // The bad file, fixed, loads on the next rescan: it was never unloaded.
  Write(dir_ / "bad.json", kRope);
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_TRUE(r.Snapshot()->Find("bad", "").ok());
}

TEST_F(ModelRegistryTest, AReloadUnderWayDoesNotBringBackAnUnloadedModel) {
  Write(dir_ / "a.json", kRope);
  for (int i = 0; i < 20; ++i) Write(dir_ / ("m" + std::to_string(i) + ".json"), kRope);
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  for (int round = 0; round < 30; ++round) {
    std::thread reload([&] { EXPECT_TRUE(r.Reload().ok()); });
    ASSERT_TRUE(r.Unload("a").ok());
    reload.join();
    ASSERT_FALSE(r.Snapshot()->Find("a", "").ok()) << "round " << round;
    ASSERT_TRUE(r.Reload({}, "a").ok());
    ASSERT_TRUE(r.Snapshot()->Find("a", "").ok()) << "round " << round;
  }
}

TEST_F(ModelRegistryTest, CancelledReloadKeepsTheOldSet) {
  Write(dir_ / "a.json", kRope);
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  Write(dir_ / "b.json", kRope);
  EXPECT_EQ(r.Reload([] { return true; }).code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(r.Snapshot()->Find("b", "").ok());
  EXPECT_TRUE(r.Snapshot()->Find("a", "").ok());
}

TEST_F(ModelRegistryTest, SymlinksMustStayInsideTheDirectory) {
  // The ConfigMap layout: name -> ..data/name, ..data -> a timestamped dir.
  fs::create_directory(dir_ / "..2024_01_01");
  Write(dir_ / "..2024_01_01" / "cm.json", kRope);
  fs::create_directory_symlink("..2024_01_01", dir_ / "..data");
  fs::create_symlink("..data/cm.json", dir_ / "cm.json");
  char pattern[] = "/tmp/posenc_models_out_XXXXXX";
  const fs::path outside = mkdtemp(pattern);
  Write(outside / "ext.json", kRope);
  fs::create_symlink(outside / "ext.json", dir_ / "ext.json");
  ModelRegistry r(Options());
  ASSERT_TRUE(r.Reload().ok());
  EXPECT_TRUE(r.Snapshot()->Find("cm", "").ok());
  EXPECT_NE(Reason(*r.Snapshot(), "ext").find("outside"), std::string::npos);
  fs::remove_all(outside);
}

TEST_F(ModelRegistryTest, MissingDirectoryIsReported) {
  ModelRepositoryOptions o;
  o.dir = (dir_ / "nowhere").string();
  ModelRegistry r(o);
  ASSERT_TRUE(r.Reload().ok());
  ASSERT_EQ(r.Snapshot()->skipped().size(), 1u);
  EXPECT_NE(r.Snapshot()->skipped()[0].reason.find("cannot resolve directory"), std::string::npos);
  EXPECT_EQ(r.Snapshot()->models().size(), BuiltInModels().size());
}

TEST_F(ModelRegistryTest, FloodedDirectoryIsBounded) {
  for (int i = 0; i < 20; ++i) Write(dir_ / ("m" + std::to_string(i) + ".json"), "bad");
  ModelRepositoryOptions o = Options();
  o.max_files = 5;
  ModelRegistry r(o);
  ASSERT_TRUE(r.Reload().ok());
  const auto& skipped = r.Snapshot()->skipped();
  ASSERT_EQ(skipped.size(), 6u);
  EXPECT_NE(skipped[0].reason.find("15 more .json files not considered"), std::string::npos);
}

}  // namespace
}  // namespace posenc::server::kserve
