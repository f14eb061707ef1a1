// posenc-cli as a user runs it, against the real posenc-server: enum flags
// in any case mean what they say (it used to run `--style=GPTJ` as NEOX,
// `--layout=BHSD` as BSHD and `--backend=gpu` on the CPU, and `--form=alibi`
// as causal, all with exit 0); local errors are told apart from the server's.
#include <sys/wait.h>

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
