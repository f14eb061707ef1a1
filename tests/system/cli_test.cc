// posenc-cli as a user runs it, against the real posenc-server: enum flags
// in any case mean what they say (it used to run `--style=GPTJ` as NEOX,
// `--layout=BHSD` as BSHD and `--backend=gpu` on the CPU, and `--form=alibi`
// as causal, all with exit 0); local errors are told apart from the server's.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "npy.h"
#include "server_process.h"

namespace posenc {
namespace {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start(POSENC_SERVER_BINARY, {"--enable_cuda=false"})) << server_.log_text();
    char dir[] = "/tmp/posenc_cli_XXXXXX";
    dir_ = mkdtemp(dir);
    // A random query [2, 3, 4, 16] (S = 3 != H = 4, so layouts differ).
    const uint64_t seed = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> q(2 * 3 * 4 * 16);
    for (float& v : q) v = u(rng);
    ASSERT_TRUE(cli::WriteNpy(dir_ + "/q.npy", DType::kFloat32, {2, 3, 4, 16},
                              std::string(reinterpret_cast<const char*>(q.data()), q.size() * 4))
                    .ok());
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  Result Run(const std::string& args) {
    const std::string out = dir_ + "/out.txt";
    const std::string cmd = std::string(POSENC_CLI_BINARY) +
                            " --target=127.0.0.1:" + std::to_string(server_.port()) + " " + args +
                            " > " + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.output = testing::ReadFile(out);
    return r;
  }
  // The rotated query for these flags, as .npy bytes.
  std::string Rotated(const std::string& flags) {
    const std::string path = dir_ + "/rotated.npy";
    const Result r = Run("rope --input=" + dir_ + "/q.npy --output=" + path + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.output;
    return testing::ReadFile(path);
  }

  testing::ServerProcess server_;
  std::string dir_;
};

TEST_F(Cli, EnumFlagsMeanWhatTheySayInAnyCase) {
  const std::string neox = Rotated("--style=neox");
  const std::string gptj = Rotated("--style=gptj");
  EXPECT_NE(neox, gptj) << "the two styles must rotate different pairs";
  EXPECT_EQ(Rotated("--style=GPTJ"), gptj);
  EXPECT_EQ(Rotated("--style=GptJ"), gptj);
  const std::string bshd = Rotated("--layout=bshd");
  const std::string bhsd = Rotated("--layout=bhsd");
  EXPECT_NE(bshd, bhsd) << "positions run along S, which the layouts place differently";
  EXPECT_EQ(Rotated("--layout=BHSD"), bhsd);
  EXPECT_EQ(Rotated("--scaling=LINEAR --factor=2"), Rotated("--scaling=linear --factor=2"));
  EXPECT_NE(Rotated("--scaling=linear --factor=2"), neox);
}

TEST_F(Cli, HfConfigRotatesAsTheFlagsItStandsFor) {
  // YaRN with the factor unset: transformers infers 65536 / 4096 = 16.
  const std::string config = dir_ + "/config.json";
  std::FILE* f = std::fopen(config.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"model_type": "qwen2", "head_dim": 16, "rope_theta": 500000,
                 "max_position_embeddings": 65536, "rope_scaling": {"rope_type": "yarn",
                 "factor": null, "original_max_position_embeddings": 4096}})",
             f);
  std::fclose(f);
  const std::string from_config = Rotated("--hf_config=" + config + " --offset=20000");
  EXPECT_EQ(from_config, Rotated("--base=500000 --scaling=yarn --factor=16 "
                                 "--original_max_position=4096 --offset=20000"));
  EXPECT_NE(from_config, Rotated("--base=500000 --offset=20000"));
  EXPECT_EQ(Rotated("--hf_config=" + config + " --offset=20000 --base=500000"), from_config);
  const Result r = Run("rope --input=" + dir_ + "/q.npy --hf_config=" + config + " --base=20000");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("base is 20000 but hf_config gives 500000"), std::string::npos)
      << r.output;
}

TEST_F(Cli, UnknownValuesAreRefusedNamingTheFlag) {
  for (const auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"bias --form=alibi", "--form"},
           {"rope --shape=1,2,2,8 --style=rotary", "--style"},
           {"rope --shape=1,2,2,8 --layout=sbhd", "--layout"},
           {"rope --shape=1,2,2,8 --dtype=float64", "--dtype"},
           {"rope --shape=1,2,2,8 --backend=tpu", "--backend"},
           {"table --dim=4 --count=4 --sinusoidal_layout=zigzag", "--sinusoidal_layout"},
           {"table --dim=4 --count=4 --encoding=rotary", "--encoding"}}) {
    const Result r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(flag + " must be one of"), std::string::npos)
        << args << ": " << r.output;
  }
}

TEST_F(Cli, TheServersErrorsAndOursAreToldApart) {
  // --backend=gpu means CUDA: a CPU-only server refuses it (it used to run).
  Result r = Run("rope --shape=1,2,2,8 --backend=gpu");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the server answered FAILED_PRECONDITION"), std::string::npos)
      << r.output;
  // A missing local file is ours: no gRPC code, nothing sent.
  r = Run("rope --input=" + dir_ + "/missing.npy");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing.npy"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("NOT_FOUND"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("the server answered"), std::string::npos) << r.output;
}

// The size a PNG declares in its IHDR chunk (bytes 16-23, big-endian), or
// {0, 0} when the bytes are not a PNG.
std::pair<uint32_t, uint32_t> PngSize(const std::string& png) {
  if (png.size() < 24 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return {0, 0};
  const auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(png[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

TEST_F(Cli, HeatmapsAreShapedForReadingAndHeadsChecked) {
  // 128 positions x 1024 dimensions: wider than tall, but no strip (the
  // plot alone is 1024 x 512 by the rule of client/cli/heatmap_layout.h).
  Result r = Run("table --dim=1024 --count=128 --png=" + dir_ + "/table.png");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto [w, h] = PngSize(testing::ReadFile(dir_ + "/table.png"));
  EXPECT_GT(w, 1024u) << h;
  EXPECT_GT(h, 512u) << w;
  EXPECT_LT(w, 2 * h) << "a 128 x 1024 table must not become a strip";
  // A head past --heads is refused before the call, naming the flag.
  r = Run("bias --heads=4 --png_head=4 --png=" + dir_ + "/bias.png");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--png_head must be in [0, --heads) = [0, 4), got 4"), std::string::npos)
      << r.output;
  r = Run("bias --heads=4 --png_head=3 --q_len=40 --k_len=40 --causal --png=" + dir_ + "/bias.png");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto [bw, bh] = PngSize(testing::ReadFile(dir_ + "/bias.png"));
  EXPECT_GT(bw, 640u) << bh;  // the 40 x 40 plot alone is 640 x 640
  EXPECT_GT(bh, 640u) << bw;
}

// What a person types first: --help lists the commands and this tool's own
// flags (it used to print "No flags matched"); --version names the version
// CMake gave the project, the build type and whether CUDA was compiled in.
Result RunAlone(const std::string& args) {
  char path[] = "/tmp/posenc_cli_help_XXXXXX";
  const int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  const int status =
      std::system((std::string(POSENC_CLI_BINARY) + " " + args + " > " + path + " 2>&1").c_str());
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = testing::ReadFile(path);
  std::remove(path);
  return r;
}

TEST(CliUsage, HelpListsCommandsAndFlags) {
  const Result r = RunAlone("--help");
  EXPECT_EQ(r.output.find("No flags matched"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("posenc-cli: posenc-cli"), std::string::npos) << r.output;
  for (const char* command : {"info", "tables", "reload", "rope", "absolute", "table", "bias"}) {
    EXPECT_NE(r.output.find(std::string("\n  ") + command + " "), std::string::npos)
        << command << " missing from:\n"
        << r.output;
  }
  for (const char* flag : {"--target", "--shape", "--png", "--png_head", "--heads", "--dim"}) {
    EXPECT_NE(r.output.find(std::string(flag) + " ("), std::string::npos)
        << flag << " missing from:\n"
        << r.output;
  }
}

TEST(CliUsage, VersionNamesVersionBuildAndCuda) {
  const Result r = RunAlone("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(std::string("posenc-cli ") + POSENC_PROJECT_VERSION + "\n", 0), 0u)
      << r.output;
#ifdef NDEBUG
  EXPECT_NE(r.output.find("Release build"), std::string::npos) << r.output;
#else
  EXPECT_NE(r.output.find("Debug build"), std::string::npos) << r.output;
#endif
  EXPECT_NE(r.output.find(POSENC_EXPECT_CUDA ? "CUDA compiled in" : "CUDA not compiled in"),
            std::string::npos)
      << r.output;
}

// --k_starts masks each sequence's left padding, and its real keys carry
// the bias of the same sequence sent unpadded; a malformed list is ours
// (exit 2), an out-of-range value the server's (exit 1), both named.
TEST_F(Cli, KStartsMasksLeftPadding) {
  const std::string padded_path = dir_ + "/padded.npy", plain_path = dir_ + "/plain.npy";
  Result r =
      Run("bias --heads=3 --q_len=7 --k_len=7 --causal --k_starts=3,0 --output=" + padded_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Run("bias --heads=3 --q_len=4 --k_len=4 --causal --output=" + plain_path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto padded = cli::ReadNpy(padded_path);
  auto plain = cli::ReadNpy(plain_path);
  ASSERT_TRUE(padded.ok() && plain.ok());
  ASSERT_EQ(padded->shape, (std::vector<int64_t>{2, 3, 7, 7}));
  ASSERT_EQ(plain->shape, (std::vector<int64_t>{1, 3, 4, 4}));
  auto at = [](const cli::NpyArray& a, int64_t e) {
    float v;
    std::memcpy(&v, a.data.data() + 4 * e, 4);
    return v;
  };
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t j = 0; j < 7; ++j) {
        // Sequence 0: three padded keys, then the plain sequence shifted.
        const float got = at(*padded, (h * 7 + i) * 7 + j);
        if (j < 3 || i < 3) {
          EXPECT_TRUE(std::isinf(got) && got < 0) << h << " " << i << " " << j << ": " << got;
        } else {
          EXPECT_EQ(got, at(*plain, (h * 4 + i - 3) * 4 + j - 3)) << h << " " << i << " " << j;
        }
        // Sequence 1: no padding, causal only.
        const float unpadded = at(*padded, ((3 + h) * 7 + i) * 7 + j);
        EXPECT_EQ(std::isinf(unpadded), j > i) << h << " " << i << " " << j;
      }
    }
  }

  r = Run("bias --heads=1 --q_len=2 --k_len=2 --k_starts=1,x");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--k_starts: value 1 must be an integer, got 'x'"), std::string::npos)
      << r.output;
  r = Run("bias --heads=1 --q_len=2 --k_len=2 --k_lens=2,1 --k_starts=0,2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the server answered INVALID_ARGUMENT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("k_starts[1] must be in [0, k_lens[1] = 1], got 2"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace posenc
