#pragma once
// The modes of ds4-test, in the order --all runs them. Each mode writes its checks to the report
// and never throws: an error inside a mode is one failed check.
#include <string>
#include <vector>

#include "report.h"
#include "test_env.h"

namespace ds4::test {

struct Mode {
    std::string name;  // the flag without "--"
    std::string help;
    void (*run)(TestEnv &, Report &);
};

const std::vector<Mode> &all_modes();

void run_logprob_vectors(TestEnv &env, Report &rep);
void run_prefill_decode(TestEnv &env, Report &rep);
void run_kv_roundtrip(TestEnv &env, Report &rep);
void run_transformers_parity(TestEnv &env, Report &rep);
void run_ssd_streaming_cache_pressure(TestEnv &env, Report &rep);
void run_backend_parity(TestEnv &env, Report &rep);
void run_server(TestEnv &env, Report &rep);

}  // namespace ds4::test
