// The memory limit the kernel enforces on this process: its cgroup's
// (cgroup v2 memory.max, or v1 memory.limit_in_bytes), the least of those
// set on the way up from its own cgroup. Read once at start-up, so that
// --max_inflight_bytes can default to what fits under it: in a container
// with a memory limit (docker run -m, a Kubernetes pod's limits.memory)
// the server's fixed 4 GiB budget would let the kernel kill the process
// under load, where the server promises RESOURCE_EXHAUSTED instead.
//
// The files come from the kernel, but they are parsed as any input is:
// a line or value that does not read as expected counts as no limit there,
// and no path is followed out of the cgroup mount.
#ifndef POSENC_SERVER_ENGINE_MEMORY_LIMIT_H_
#define POSENC_SERVER_ENGINE_MEMORY_LIMIT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace posenc::server {

// What docs/server.md "Memory" bounds the server's resident memory by,
// beyond --max_inflight_bytes: the process, the kernels' caches, thread
// stacks, transport buffers and allocator slack (CPU backend; a CUDA
// context's host memory comes on top).
inline constexpr int64_t kFixedOverheadBytes = int64_t{96} << 20;

struct MemoryLimit {
  int64_t bytes = 0;
  std::string file;  // the limit file that set it
};

// Where ReadCgroupMemoryLimit looks; tests point these into a directory of
// their own.
struct CgroupFiles {
  std::string mountinfo = "/proc/self/mountinfo";
  std::string cgroup = "/proc/self/cgroup";
  std::string mount_prefix;  // put before the mount points mountinfo names
  // Limits at or above this are no limit (v1 writes "none" as 2^63 less a
  // page); 0: this machine's physical memory.
  int64_t physical_memory_bytes = 0;
};

// This process's memory limit, or nullopt where none is set (v2 "max", v1's
// near-2^63, anything not below the machine's memory, or no cgroup mount
// with the memory controller) or it cannot be read.
std::optional<MemoryLimit> ReadCgroupMemoryLimit(const CgroupFiles& files = {});

// The memory this process may use: its cgroup's limit, or the machine's
// physical memory where that is less or there is no limit (`file` then
// says so). nullopt only where neither can be read.
std::optional<MemoryLimit> ReadMemoryLimit(const CgroupFiles& files = {});

// The pieces, for tests and the fuzz harness.

struct CgroupMount {
  std::string root;         // the part of the hierarchy mounted there
  std::string mount_point;  // octal escapes (\040) decoded
  bool v2 = false;
};

// From /proc/self/mountinfo: the mounts of cgroup v1 hierarchies with the
// memory controller and of cgroup2, in the file's order (mounts whose root
// or mount point is not a clean absolute path are left out).
std::vector<CgroupMount> MemoryCgroupMounts(absl::string_view mountinfo);

struct MemoryCgroup {
  CgroupMount mount;
  std::string path;  // the process's cgroup in the mount's hierarchy
};

// The process's memory cgroup and the mount to find it under: v1's memory
// hierarchy where one is mounted (a hybrid host keeps memory there, and its
// cgroup2 mount has none), else cgroup2; of that hierarchy's mounts, the
// one whose root holds the process's cgroup (the longest such root: a host
// may mount the hierarchy more than once, a monitoring pod the host's whole
// tree beside its own), else the first (a cgroup namespace's view).
std::optional<MemoryCgroup> FindMemoryCgroup(absl::string_view mountinfo,
                                             absl::string_view proc_cgroup);

// From /proc/self/cgroup: this process's cgroup in that hierarchy (v1: the
// line whose controllers include memory; v2: the "0::" line). An absolute
// path without "." or ".." components, else nullopt.
std::optional<std::string> CgroupPathOf(absl::string_view proc_cgroup, bool v2);

// The cgroup's directory under the mount, relative to the mount point (""
// for the mount point itself): the path less the mount's root. A path
// outside that root (a cgroup namespace's view) gives "": the mount point
// is then the process's own cgroup as far as it can see.
std::string RelativeToMount(const std::string& path, const std::string& root);

// A limit file's text: bytes, or nullopt for "max" and anything that is not
// a decimal number of bytes below 2^63 followed by at most a newline.
std::optional<int64_t> ParseLimitBytes(absl::string_view text);

// What --max_inflight_bytes=0 stands for: `unconstrained` without a limit;
// under one, the limit less kFixedOverheadBytes, two of the largest
// messages (`message_limit`: the larger of --max_message_bytes and
// --max_request_bytes; what the transport may hold beyond the budget,
// ServerOptions::transport_memory_limit) and `table_bytes` (the learned
// tables' cap, --max_table_bytes, where a --table_dir is served), no more
// than `unconstrained` and no less than two messages (the least a budget
// can be, EngineOptions::Validate; a limit too small for that is warned
// about at start-up, PeakMemoryBytes). Negative sizes count as 0 (Validate
// refuses them afterwards).
int64_t InflightBytesUnder(std::optional<int64_t> limit, int64_t message_limit, int64_t table_bytes,
                           int64_t unconstrained);

// The most the server's resident memory can reach with this budget of calls
// in flight, transport quota (--max_memory_bytes, which includes the
// budget) and tables: the budget and two oversized messages the transport
// receives whole before it refuses them (docs/server.md "Memory"), or the
// quota where that is more, the tables and the fixed overhead.
int64_t PeakMemoryBytes(int64_t max_inflight_bytes, int64_t message_limit,
                        int64_t transport_memory_limit, int64_t table_bytes);

}  // namespace posenc::server

#endif  // POSENC_SERVER_ENGINE_MEMORY_LIMIT_H_
