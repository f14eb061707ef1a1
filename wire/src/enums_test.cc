// Every enum pair translates both ways without loss; unknown wire values and
// unknown names are errors naming the field, never a silent default (the
// CLI used to run `--style=GPTJ` as NEOX and `--layout=BHSD` as BSHD).
#include "posenc/wire/enums.h"

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"

namespace posenc::wire {
namespace {

// Walks every value the proto defines: each must decode (UNSPECIFIED to the
// field's default, if it has one) and everything else must round-trip.
template <typename Kernel, typename Wire>
void ExpectWireRoundTrip(bool unspecified_has_default) {
  const google::protobuf::EnumDescriptor* d = google::protobuf::GetEnumDescriptor<Wire>();
  SCOPED_TRACE(d->full_name());
  int decoded = 0;
  for (int i = 0; i < d->value_count(); ++i) {
    const Wire w = static_cast<Wire>(d->value(i)->number());
    absl::StatusOr<Kernel> k = FromProto("the_field", w);
    if (d->value(i)->number() == 0 && !unspecified_has_default) {
      EXPECT_FALSE(k.ok()) << d->value(i)->name();
      continue;
    }
    ASSERT_TRUE(k.ok()) << d->value(i)->name() << ": " << k.status();
    ++decoded;
    if (d->value(i)->number() != 0) EXPECT_EQ(ToProto(*k), w) << d->value(i)->name();
  }
  EXPECT_GE(decoded, 2);
  // A number the proto does not define (a newer client, a fuzzer).
  absl::StatusOr<Kernel> bad = FromProto("the_field", static_cast<Wire>(97));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("the_field"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("97"), std::string::npos) << bad.status();
}

// Every canonical name parses in any case to a value whose wire form decodes
// back to it and whose name is that name.
template <typename Kernel>
void ExpectNamesRoundTrip() {
  const std::vector<std::string> names = NamesOf<Kernel>();
  ASSERT_GE(names.size(), 2u);
  for (const std::string& name : names) {
    for (const std::string& text :
         {name, absl::AsciiStrToUpper(name),
          std::string(1, absl::ascii_toupper(name[0])) + name.substr(1)}) {
      absl::StatusOr<Kernel> k = Parse<Kernel>("--flag", text);
      ASSERT_TRUE(k.ok()) << text << ": " << k.status();
      EXPECT_EQ(NameOf(*k), name);
      absl::StatusOr<Kernel> back = FromProto("f", ToProto(*k));
      ASSERT_TRUE(back.ok()) << name;
      EXPECT_EQ(*back, *k) << name;
    }
  }
  absl::StatusOr<Kernel> bad = Parse<Kernel>("--flag", "no-such-value");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--flag"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'no-such-value'"), std::string::npos);
  EXPECT_NE(bad.status().message().find(names[1]), std::string::npos) << bad.status();
}

TEST(WireEnums, EveryProtoValueRoundTrips) {
  ExpectWireRoundTrip<DType, v1::DataType>(false);
  ExpectWireRoundTrip<RopeLayout, v1::RopeLayout>(true);
  ExpectWireRoundTrip<RopeStyle, v1::RopeStyle>(true);
  ExpectWireRoundTrip<ScalingType, v1::ScalingType>(true);
  ExpectWireRoundTrip<LongRopeMode, v1::LongRopeMode>(true);
  ExpectWireRoundTrip<AxisMode, v1::AxisMode>(true);
  ExpectWireRoundTrip<SinusoidalLayout, v1::SinusoidalLayout>(true);
  ExpectWireRoundTrip<BiasForm, v1::BiasForm>(true);
  ExpectWireRoundTrip<BackendChoice, v1::Backend>(true);
}

TEST(WireEnums, EveryNameParsesInAnyCase) {
  ExpectNamesRoundTrip<DType>();
  ExpectNamesRoundTrip<RopeLayout>();
  ExpectNamesRoundTrip<RopeStyle>();
  ExpectNamesRoundTrip<ScalingType>();
  ExpectNamesRoundTrip<LongRopeMode>();
  ExpectNamesRoundTrip<AxisMode>();
  ExpectNamesRoundTrip<SinusoidalLayout>();
  ExpectNamesRoundTrip<BiasForm>();
  ExpectNamesRoundTrip<BackendChoice>();
}

// The defects the CLI shipped with, by name.
TEST(WireEnums, TheCliDefectsAreGone) {
  EXPECT_EQ(Parse<RopeStyle>("--style", "GPTJ").value(), RopeStyle::kGptj);
  EXPECT_EQ(Parse<RopeLayout>("--layout", "BHSD").value(), RopeLayout::kBHSD);
  EXPECT_EQ(Parse<BackendChoice>("--backend", "gpu").value(), BackendChoice::kCuda);
  EXPECT_EQ(Parse<DType>("--dtype", "BF16").value(), DType::kBFloat16);
  absl::StatusOr<BiasForm> alibi = Parse<BiasForm>("--form", "alibi");
  ASSERT_FALSE(alibi.ok());
  EXPECT_NE(alibi.status().message().find("--form must be one of none, causal, symmetric"),
            std::string::npos)
      << alibi.status();
}

// Defaults of UNSPECIFIED are the documented ones (posenc.proto).
TEST(WireEnums, UnspecifiedMeansTheDocumentedDefault) {
  EXPECT_EQ(FromProto("f", v1::ROPE_LAYOUT_UNSPECIFIED).value(), RopeLayout::kBSHD);
  EXPECT_EQ(FromProto("f", v1::ROPE_STYLE_UNSPECIFIED).value(), RopeStyle::kNeox);
  EXPECT_EQ(FromProto("f", v1::SCALING_TYPE_UNSPECIFIED).value(), ScalingType::kNone);
  EXPECT_EQ(FromProto("f", v1::BIAS_FORM_UNSPECIFIED).value(), BiasForm::kCausal);
  EXPECT_EQ(FromProto("f", v1::SINUSOIDAL_LAYOUT_UNSPECIFIED).value(),
            SinusoidalLayout::kInterleaved);
  EXPECT_EQ(FromProto("f", v1::BACKEND_UNSPECIFIED).value(), BackendChoice::kDefault);
  EXPECT_FALSE(FromProto("query.dtype", v1::DATA_TYPE_UNSPECIFIED).ok());
}

}  // namespace
}  // namespace posenc::wire
