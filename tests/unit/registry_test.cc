#include "daemon/registry/registry.h"

#include "gtest/gtest.h"

namespace podlink {
namespace {

ExportRecord Rec(uint64_t session, std::string ns, std::string name = "") {
  ExportRecord r;
  r.owner_session = session;
  r.owner.namespace_ = ns;
  r.owner.name = "pod";
  r.owner.key = "pod-of-session-" + std::to_string(session);
  r.name = name;
  r.size = 4096;
  return r;
}

TEST(Registry, AddGetRelease) {
  Registry reg;
  auto id = reg.Add(Rec(1, "ml", "kv"));
  ASSERT_TRUE(id.ok());
  auto got = reg.Get(*id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->name, "kv");
  auto by_name = reg.FindByName("ml", "kv");
  ASSERT_TRUE(by_name.ok());
  EXPECT_EQ((*by_name)->id, *id);
  EXPECT_EQ(reg.FindByName("other", "kv").status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(reg.AddImporter(*id, 2).ok());
  auto removed = reg.ReleaseExport(*id, 1);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->importers, std::set<uint64_t>{2});
  EXPECT_EQ(reg.size(), 0u);
  // Double release: a clear NOT_FOUND, nothing else changes.
  EXPECT_EQ(reg.ReleaseExport(*id, 1).status().code(), absl::StatusCode::kNotFound);
  // The name is free again.
  EXPECT_TRUE(reg.Add(Rec(1, "ml", "kv")).ok());
}

TEST(Registry, NamesUniquePerNamespace) {
  Registry reg;
  ASSERT_TRUE(reg.Add(Rec(1, "ml", "kv")).ok());
  EXPECT_EQ(reg.Add(Rec(2, "ml", "kv")).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(reg.Add(Rec(2, "other", "kv")).ok());
  EXPECT_TRUE(reg.Add(Rec(2, "ml", "")).ok());
  EXPECT_TRUE(reg.Add(Rec(2, "ml", "")).ok());  // unnamed exports never clash
}

TEST(Registry, ImporterReleaseAndStrangers) {
  Registry reg;
  uint64_t id = *reg.Add(Rec(1, "ml"));
  ASSERT_TRUE(reg.AddImporter(id, 2).ok());
  EXPECT_EQ(reg.DropImport(id, 3).code(), absl::StatusCode::kNotFound);                 // stranger
  EXPECT_EQ(reg.ReleaseExport(id, 2).status().code(), absl::StatusCode::kNotFound);     // importer
  EXPECT_TRUE(reg.DropImport(id, 2).ok());
  EXPECT_EQ(reg.DropImport(id, 2).code(), absl::StatusCode::kNotFound);  // twice
  EXPECT_EQ(reg.size(), 1u);
}

// Issue 11 (11): "release" used to mean two things. Dropping an import can
// never withdraw the export, even for its owner, and a repeated import
// reports that the record already existed (so a failed re-import does not
// drop the earlier one).
TEST(Registry, DropImportNeverWithdrawsTheExport) {
  Registry reg;
  uint64_t id = *reg.Add(Rec(1, "ml"));
  ASSERT_TRUE(reg.AddImporter(id, 2).ok());
  EXPECT_EQ(reg.DropImport(id, 1).code(), absl::StatusCode::kNotFound);  // owner without an import record
  EXPECT_EQ(reg.size(), 1u);
  auto first = reg.AddImporter(id, 1);  // the owner imports its own export
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  EXPECT_TRUE(reg.DropImport(id, 1).ok());
  EXPECT_EQ(reg.size(), 1u);
  EXPECT_TRUE(reg.GetUsable(id, 2).ok());
  auto again = reg.AddImporter(id, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again) << "session 2 had imported it before";
}

TEST(Registry, PerPodLimitSpansSessions) {
  Registry reg(RegistryLimits{.max_exports_per_session = 10, .max_exports_per_pod = 3, .max_exports_total = 100});
  auto rec = [](uint64_t session, const std::string& pod) {
    ExportRecord r = Rec(session, "ml");
    r.owner.key = pod;
    return r;
  };
  ASSERT_TRUE(reg.Add(rec(1, "a")).ok());
  ASSERT_TRUE(reg.Add(rec(2, "a")).ok());
  ASSERT_TRUE(reg.Add(rec(3, "a")).ok());
  absl::Status s = reg.Add(rec(4, "a")).status();  // a fourth session of the same pod
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("per-pod limit"), absl::string_view::npos) << s;
  EXPECT_TRUE(reg.Add(rec(5, "b")).ok());  // other pods are unaffected
  reg.RemoveSession(2);
  EXPECT_TRUE(reg.Add(rec(4, "a")).ok());
}

TEST(Registry, RemoveSessionDropsOwnedAndImports) {
  Registry reg;
  uint64_t a = *reg.Add(Rec(1, "ml", "a"));
  uint64_t b = *reg.Add(Rec(1, "ml", "b"));
  uint64_t c = *reg.Add(Rec(2, "ml", "c"));
  ASSERT_TRUE(reg.AddImporter(a, 3).ok());
  ASSERT_TRUE(reg.AddImporter(c, 1).ok());
  std::vector<RemovedExport> gone = reg.RemoveSession(1);
  ASSERT_EQ(gone.size(), 2u);
  std::set<uint64_t> ids{gone[0].record->id, gone[1].record->id};
  EXPECT_EQ(ids, (std::set<uint64_t>{a, b}));
  EXPECT_EQ(reg.size(), 1u);
  auto snap = reg.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].record->id, c);
  EXPECT_EQ(snap[0].import_count, 0u);  // session 1's import record went with it
  EXPECT_EQ(snap[0].imports_total, 1u);
  EXPECT_TRUE(reg.Add(Rec(3, "ml", "a")).ok());  // names freed
  EXPECT_EQ(reg.AddImporter(a, 4).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(reg.RemoveSession(99).empty());
}

TEST(Registry, Limits) {
  Registry reg(RegistryLimits{.max_exports_per_session = 3, .max_exports_total = 5});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reg.Add(Rec(1, "ml")).ok());
  absl::Status s = reg.Add(Rec(1, "ml")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("per-session limit"), absl::string_view::npos);
  ASSERT_TRUE(reg.Add(Rec(2, "ml")).ok());
  ASSERT_TRUE(reg.Add(Rec(2, "ml")).ok());
  EXPECT_EQ(reg.Add(Rec(3, "ml")).status().code(), absl::StatusCode::kResourceExhausted);
  reg.RemoveSession(1);
  EXPECT_TRUE(reg.Add(Rec(3, "ml")).ok());
}

}  // namespace
}  // namespace podlink
