// retryctl: the operator's view of, and hand on, a host's retryd segment (see cli/commands.h).
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) { return retryd::cli::RunRetryctl(argc, argv, stdout, stderr); }
