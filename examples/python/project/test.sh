#!/bin/sh
# The test a bot runs: calc.sh must print 4.
out=$(sh calc.sh)
echo "calc says $out"
[ "$out" = 4 ] || { echo "FAIL: want 4" >&2; exit 1; }
echo PASS
