#!/usr/bin/env bash
# examples/fleet/status_line.sh RETRYCTL SEGMENT PORT_FILE DEPENDENCY: prints one line: the
# seconds since the downstream started (from PORT_FILE, written by downstream.py) and the
# dependency's row of `retryctl status` without its name.
retryctl=$1 segment=$2 port_file=$3 dep=$4
start=$(cut -d' ' -f2 "$port_file" 2>/dev/null || echo 0)
row=$("$retryctl" --segment="$segment" --color=never status "$dep" 2>/dev/null |
  grep "^$dep " | sed "s/^$dep *//")
awk -v now="$(date +%s.%N)" -v start="$start" -v row="$row" \
  'BEGIN { printf "  %5.1fs  %s\n", now - start, row }'
