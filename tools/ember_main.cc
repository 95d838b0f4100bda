// The `ember` command: one binary, sub-commands (see README.md and `ember --help`).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "tools/cli.h"

int main(int argc, char** argv) {
  CLI::App app{"Ember: a distributed data cache for training clusters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ember 0.1.0");
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  ember::tools::AddMetaCommand(app);
  ember::tools::AddDatasetCommand(app);
  ember::tools::AddStatusCommand(app);
  ember::tools::AddNodeCommands(app);
  ember::tools::AddPrefetchCommands(app);
  ember::tools::AddJobCommands(app);
  ember::tools::AddCacheCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
