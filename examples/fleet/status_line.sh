#!/usr/bin/env bash
# examples/fleet/status_line.sh RETRYCTL SEGMENT DEPENDENCY: prints the dependency's row of
# `retryctl status` without its name (retryd_fleet --status_cmd prints the time before it).
retryctl=$1 segment=$2 dep=$3
"$retryctl" --segment="$segment" --color=never status "$dep" 2>/dev/null | grep "^$dep " | sed "s/^$dep *//"
