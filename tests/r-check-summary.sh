#!/bin/sh
# Reads an R CMD check directory: prints the testthat counts as "testthat: N passed, N failed" and
# fails when the check log has an ERROR or a WARNING (R CMD check itself exits 0 on warnings).
check_dir=${1:?usage: r-check-summary.sh tfbarrier.Rcheck}
log="$check_dir/00check.log"
[ -f "$log" ] || { echo "no $log"; exit 1; }
out=$(ls "$check_dir"/tests/testthat.Rout* 2>/dev/null | head -n 1)
if [ -n "$out" ]; then
  counts=$(grep -o '\[ FAIL [0-9]* | WARN [0-9]* | SKIP [0-9]* | PASS [0-9]* \]' "$out" | tail -n 1)
  fail=$(echo "$counts" | sed -n 's/.*FAIL \([0-9]*\).*/\1/p')
  skip=$(echo "$counts" | sed -n 's/.*SKIP \([0-9]*\).*/\1/p')
  pass=$(echo "$counts" | sed -n 's/.*PASS \([0-9]*\).*/\1/p')
  echo "testthat: ${pass:-0} passed, ${fail:-0} failed, ${skip:-0} skipped"
fi
if grep -E '^\* .*\.\.\. (ERROR|WARNING)' "$log"; then
  echo "R CMD check found the ERROR/WARNING above; see $log"
  exit 1
fi
exit 0
