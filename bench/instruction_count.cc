// posenc-count-instructions: instructions per element of each kernel call
// (bench/kernel_cases.h), counted exactly by single-stepping the calling
// thread under ptrace. The session machines expose no hardware counters
// (perf stat: <not supported>) and valgrind runs no AVX-512, so this is how
// issue 26's instructions-per-element figures are taken; the count is the
// same run to run on a noisy machine. One-thread backend, so the call runs
// on the stepped thread. --filter=TEXT counts only the cases whose name
// contains it; --tokens=N scales the tensors (default 16); --cold counts
// the call that fills the RoPE rotations kept for its positions (a
// frequency set's second call; run one case at a time with --filter, as
// cases share one backend) rather than one that reads them; --profile writes
// "offset count" per instruction address (relative to the executable's
// first mapping) to the path given, for objdump.
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "kernel_cases.h"

namespace {

// Instructions the child executes between its two SIGSTOPs.
long CountBetweenStops(pid_t child, std::map<unsigned long long, long>* profile) {
  int status;
  waitpid(child, &status, 0);  // the first stop
  unsigned long long base = 0;
  if (profile != nullptr) {
    std::ifstream maps("/proc/" + std::to_string(child) + "/maps");
    std::string line;
    std::getline(maps, line);
    base = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
  }
  long steps = 0;
  while (true) {
    if (profile != nullptr) {
      user_regs_struct regs;
      ptrace(PTRACE_GETREGS, child, nullptr, &regs);
      ++(*profile)[regs.rip - base];
    }
    ptrace(PTRACE_SINGLESTEP, child, nullptr, nullptr);
    waitpid(child, &status, 0);
    if (WIFEXITED(status) || (WIFSTOPPED(status) && WSTOPSIG(status) == SIGSTOP)) break;
    ++steps;
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return steps;
}

}  // namespace

int main(int argc, char** argv) {
  std::string filter, profile_path;
  int64_t tokens = 16;
  bool cold = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--tokens=", 0) == 0) tokens = std::max<int64_t>(1, std::atoll(a.c_str() + 9));
    if (a.rfind("--filter=", 0) == 0) filter = a.substr(9);
    if (a.rfind("--profile=", 0) == 0) profile_path = a.substr(10);
    if (a == "--cold") cold = true;
  }
  auto cpu = posenc::CreateCpuBackend(1);
  std::printf("posenc-count-instructions: one call, single-stepped\n");
  for (const posenc::bench::KernelCase& c : posenc::bench::KernelCases(*cpu, tokens)) {
    if (c.name.find(filter) == std::string::npos) continue;
    // The thread's scratch and tables exist before the counted call (RoPE
    // rotations are kept from a frequency set's second call).
    c.run();
    if (!cold) c.run();
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
      ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
      raise(SIGSTOP);
      c.run();
      raise(SIGSTOP);
      _exit(0);
    }
    std::map<unsigned long long, long> profile;
    const long steps = CountBetweenStops(child, profile_path.empty() ? nullptr : &profile);
    std::printf("%-40s %9ld instructions %8lld elements %6.3f per element\n", c.name.c_str(), steps,
                static_cast<long long>(c.elements),
                static_cast<double>(steps) / static_cast<double>(c.elements));
    if (!profile_path.empty()) {
      std::FILE* f = std::fopen(profile_path.c_str(), "w");
      if (f == nullptr) return 1;
      for (const auto& [offset, count] : profile) std::fprintf(f, "%llx %ld\n", offset, count);
      std::fclose(f);
    }
  }
  return 0;
}
