#include "daemon/registry/registry.h"

#include "gtest/gtest.h"

namespace podlink {
namespace {

ExportRecord Rec(uint64_t session, std::string ns, std::string name = "") {
  ExportRecord r;
  r.owner_session = session;
  r.owner.namespace_ = ns;
  r.owner.name = "pod";
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

  RemovedExport removed;
  ASSERT_TRUE(reg.AddImporter(*id, 2).ok());
  auto what = reg.Release(*id, 1, &removed);
  ASSERT_TRUE(what.ok());
  EXPECT_EQ(*what, Registry::Released::kExport);
  EXPECT_EQ(removed.importers, std::set<uint64_t>{2});
  EXPECT_EQ(reg.size(), 0u);
  // Double release: a clear NOT_FOUND, nothing else changes.
  EXPECT_EQ(reg.Release(*id, 1, &removed).status().code(), absl::StatusCode::kNotFound);
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
  RemovedExport removed;
  EXPECT_EQ(reg.Release(id, 3, &removed).status().code(), absl::StatusCode::kNotFound);  // stranger
  auto what = reg.Release(id, 2, &removed);
  ASSERT_TRUE(what.ok());
  EXPECT_EQ(*what, Registry::Released::kImport);
  EXPECT_EQ(reg.Release(id, 2, &removed).status().code(), absl::StatusCode::kNotFound);  // twice
  EXPECT_EQ(reg.size(), 1u);
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
  EXPECT_EQ(reg.AddImporter(a, 4).code(), absl::StatusCode::kNotFound);
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
