// kpgo's LevelDB benchmark. Debian packages the LevelDB library (libleveldb-dev) but not its
// db_bench, so kpgo builds this small program against the real library at setup. It runs the
// four operations the kernel-PGO studies used and prints one db_bench-style line for each:
//   fillseq      :       3.784 micros/op 264066 ops/sec 0.189 seconds 50000 operations
// Usage: leveldb-bench --db=DIR [--num=N] [--value_size=BYTES] [--benchmarks=a,b,...]
#include <leveldb/db.h>
#include <leveldb/options.h>
#include <leveldb/write_batch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Config {
  std::string db;
  long num = 100000;
  int value_size = 100;
  std::string benchmarks = "fillseq,fillrandom,readrandom,readseq";
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "leveldb-bench: %s\n", msg.c_str());
  std::exit(1);
}

void check(const leveldb::Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.ToString());
}

std::string key(long i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016ld", i);
  return buf;
}

std::unique_ptr<leveldb::DB> open_db(const Config& c, bool fresh) {
  leveldb::Options opt;
  opt.create_if_missing = true;
  opt.compression = leveldb::kNoCompression;
  if (fresh) leveldb::DestroyDB(c.db, opt);
  leveldb::DB* db = nullptr;
  check(leveldb::DB::Open(opt, c.db, &db), "open");
  return std::unique_ptr<leveldb::DB>(db);
}

// Runs one benchmark; returns the number of operations done.
long run(const std::string& name, const Config& c, std::unique_ptr<leveldb::DB>& db, std::mt19937_64& rng) {
  std::string value(c.value_size, 'x');
  std::uniform_int_distribution<long> pick(0, c.num - 1);
  leveldb::WriteOptions wo;
  leveldb::ReadOptions ro;
  if (name == "fillseq" || name == "fillrandom") {
    db.reset();  // release the lock before destroying the old database
    db = open_db(c, true);
    for (long i = 0; i < c.num; i++) {
      long k = name == "fillseq" ? i : pick(rng);
      value[i % c.value_size] = static_cast<char>('a' + (i % 26));
      check(db->Put(wo, key(k), value), "put");
    }
    return c.num;
  }
  if (name == "readrandom") {
    std::string got;
    long found = 0;
    for (long i = 0; i < c.num; i++) {
      leveldb::Status s = db->Get(ro, key(pick(rng)), &got);
      if (s.ok()) found++;
      else if (!s.IsNotFound()) check(s, "get");
    }
    if (found == 0) die("readrandom found no key (run a fill benchmark first)");
    return c.num;
  }
  if (name == "readseq") {
    std::unique_ptr<leveldb::Iterator> it(db->NewIterator(ro));
    long n = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) n++;
    check(it->status(), "iterate");
    if (n == 0) die("readseq found an empty database (run a fill benchmark first)");
    return n;
  }
  die("unknown benchmark '" + name + "' (known: fillseq, fillrandom, readrandom, readseq)");
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&](const char* flag) -> const char* {
      size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = val("--db=")) c.db = v;
    else if (const char* v = val("--num=")) c.num = std::atol(v);
    else if (const char* v = val("--value_size=")) c.value_size = std::atoi(v);
    else if (const char* v = val("--benchmarks=")) c.benchmarks = v;
    else die("unknown option " + a + " (use --db= --num= --value_size= --benchmarks=)");
  }
  if (c.db.empty() || c.num <= 0 || c.value_size <= 0) die("need --db=DIR, --num > 0 and --value_size > 0");
  std::unique_ptr<leveldb::DB> db = open_db(c, false);
  std::mt19937_64 rng(301);
  std::stringstream list(c.benchmarks);
  std::string name;
  while (std::getline(list, name, ',')) {
    auto t0 = std::chrono::steady_clock::now();
    long ops = run(name, c, db, rng);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-12s : %11.3f micros/op %ld ops/sec %.3f seconds %ld operations\n", name.c_str(), secs * 1e6 / ops,
                static_cast<long>(ops / secs), secs, ops);
    std::fflush(stdout);
  }
  return 0;
}
