// The `sample` subcommand (alias `generate`): its options declared once, for main.cc to add and run.
#pragma once
#include <CLI/CLI.hpp>

#include "zerorun/sample.h"

namespace zerorun {
CLI::App* add_sample_command(CLI::App& app, SampleOptions& o);
}  // namespace zerorun
