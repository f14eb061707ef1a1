#include "posenc/positions.h"

#include <vector>

#include "gtest/gtest.h"

namespace posenc {
namespace {

template <typename T>
TensorView View(const std::vector<T>& v, std::vector<int64_t> shape) {
  return TensorView{sizeof(T) == 4 ? DType::kInt32 : DType::kInt64, std::move(shape), v.data(),
                    v.size() * sizeof(T)};
}

TEST(Positions, DefaultIsIndexInSequence) {
  auto r = ResolvePositions(PaddedLayout(2, 3), {}, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->values, (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(r->sequence_length, (std::vector<int64_t>{3, 3}));
}

TEST(Positions, OffsetsShiftEachSequence) {
  std::vector<int32_t> off = {10, -4};
  PositionInputs in;
  in.offsets = View(off, {2});
  auto r = ResolvePositions(PaddedLayout(2, 2), in, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->values, (std::vector<int64_t>{10, 11, -4, -3}));
  EXPECT_EQ(r->sequence_length, (std::vector<int64_t>{12, 0}));
}

TEST(Positions, BroadcastPositionIdsAcrossBatch) {
  std::vector<int64_t> ids = {5, 7};
  PositionInputs in;
  in.position_ids = View(ids, {1, 2});
  auto r = ResolvePositions(PaddedLayout(3, 2), in, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->values, (std::vector<int64_t>{5, 7, 5, 7, 5, 7}));
}

TEST(Positions, PackedSequencesAndAxes) {
  std::vector<int32_t> cu = {0, 1, 1, 3};
  auto layout = PackedLayout(View(cu, {4}), 3);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6};
  PositionInputs in;
  in.position_ids = View(ids, {3, 2});
  auto r = ResolvePositions(*layout, in, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_sequence, (std::vector<int32_t>{0, 2, 2}));
  EXPECT_EQ(r->sequence_length, (std::vector<int64_t>{3, 0, 7}));
}

TEST(Positions, EmptySequencesTakePaddedPositionIds) {
  // [batch, 0] sequences: position_ids of shape [batch, 0] (or [1, 0]), as
  // for any other length, not the packed [0].
  std::vector<int64_t> none;
  PositionInputs in;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{2, 0}, {1, 0}, {2, 0, 1}}) {
    in.position_ids = View(none, shape);
    auto r = ResolvePositions(PaddedLayout(2, 0), in, 1);
    ASSERT_TRUE(r.ok()) << ShapeString(shape) << ": " << r.status();
    EXPECT_TRUE(r->values.empty());
    EXPECT_EQ(r->sequence_length, (std::vector<int64_t>{0, 0}));
  }
  in.position_ids = View(none, {0});
  auto r = ResolvePositions(PaddedLayout(2, 0), in, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("position_ids.shape must be [2, 0]"), absl::string_view::npos)
      << r.status();
  // A packed layout of no tokens takes [0].
  auto packed = PackedLayout(TensorView(), 0);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_TRUE(ResolvePositions(*packed, in, 1).ok());
}

TEST(Positions, ErrorsNameTheField) {
  std::vector<int32_t> cu = {0, 2, 1};
  auto bad = PackedLayout(View(cu, {3}), 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cu_seqlens"), absl::string_view::npos);

  std::vector<int64_t> ids = {1, 2, 3};
  PositionInputs in;
  in.position_ids = View(ids, {3});
  auto r = ResolvePositions(PaddedLayout(1, 2), in, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("position_ids.shape must be [1, 2]"), absl::string_view::npos)
      << r.status();

  std::vector<int64_t> huge = {int64_t{1} << 40};
  in.position_ids = View(huge, {1, 1});
  r = ResolvePositions(PaddedLayout(1, 1), in, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  std::vector<int32_t> off = {0};
  in.offsets = View(off, {1});
  r = ResolvePositions(PaddedLayout(1, 1), in, 1);
  EXPECT_NE(r.status().message().find("mutually exclusive"), absl::string_view::npos);
}

}  // namespace
}  // namespace posenc
