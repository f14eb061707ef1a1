// The CUDA backend's whole call on host tensors, as the server makes it
// (staging, copies and kernel), against a PCIe round trip of the same bytes
// and the CPU backend, in the same run. Part of posenc-bench-gpu.
#ifndef POSENC_BENCH_GPU_STAGING_H_
#define POSENC_BENCH_GPU_STAGING_H_

#include <string>
#include <vector>

namespace posenc::bench {

struct StagingRow {
  std::string name;
  double bytes;    // of the tensors (each crosses PCIe twice)
  double ms;       // median of the whole call
  double pcie_ms;  // the same bytes up and down from pinned memory
};

// Empty (with a line on stderr) when the backend cannot be made.
std::vector<StagingRow> MeasureStaging();

}  // namespace posenc::bench

#endif  // POSENC_BENCH_GPU_STAGING_H_
