#!/bin/sh
# Reads an R CMD check directory: prints the testthat counts as "testthat: N passed, N failed, N skipped"
# and fails when
# - the check log has an ERROR or a WARNING (R CMD check itself exits 0 on warnings): on a check's line,
#   on a line of its own (R prints a failed test run's ERROR there), or in the closing Status line,
# - a test failed (the FAIL count of testthat's summary line),
# - the testthat output or its summary line is missing (the tests did not run to the end),
# - a test was skipped for a reason other than the ones allowed here: sparklyr and pysparklyr, which
#   cannot be installed on this project's machines. Every other test can run here, so a skip means
#   something it needs is missing (tfbarrier's Python, Java, rpy2, pyspark's Connect extras).
check_dir=${1:?usage: r-check-summary.sh tfbarrier.Rcheck}
allowed_skips='^(sparklyr cannot be loaded|pysparklyr cannot be loaded) \([0-9]+\)$'
log="$check_dir/00check.log"
[ -f "$log" ] || { echo "no $log"; exit 1; }
status=0
if grep -E '^\* .*\.\.\. (ERROR|WARNING)|^ ?(ERROR|WARNING)$|^Status: .*(ERROR|WARNING)' "$log"; then
  echo "R CMD check found the ERROR/WARNING above; see $log"
  status=1
fi
out=$(ls "$check_dir"/tests/testthat.Rout* 2>/dev/null | head -n 1)
if [ -z "$out" ]; then
  echo "no testthat output in $check_dir/tests: the R tests did not run"
  exit 1
fi
counts=$(grep -o '\[ FAIL [0-9]* | WARN [0-9]* | SKIP [0-9]* | PASS [0-9]* \]' "$out" | tail -n 1)
if [ -z "$counts" ]; then
  echo "no testthat summary line ([ FAIL n | WARN n | SKIP n | PASS n ]) in $out: the R tests did not finish"
  exit 1
fi
fail=$(echo "$counts" | sed -n 's/.*FAIL \([0-9]*\).*/\1/p')
skip=$(echo "$counts" | sed -n 's/.*SKIP \([0-9]*\).*/\1/p')
pass=$(echo "$counts" | sed -n 's/.*PASS \([0-9]*\).*/\1/p')
echo "testthat: $pass passed, $fail failed, $skip skipped"
if [ "$fail" -gt 0 ]; then
  echo "$fail R test(s) failed:"
  sed -n 's/^ *── \(Failure\|Error\) \(.*\) ──$/  \1 \2/p' "$out"
  status=1
fi
# testthat lists each skip reason as "• reason (count)" under "══ Skipped tests".
reasons=$(sed -n '/^══ Skipped tests/,/^\[ FAIL/p' "$out" | sed -n 's/^• //p' | sort -u)
unexpected=$(printf '%s\n' "$reasons" | grep -v -E "$allowed_skips" | grep -v '^$')
if [ "$skip" -gt 0 ] && [ -z "$reasons" ]; then
  echo "$skip test(s) skipped, but $out does not say why"
  status=1
elif [ -n "$unexpected" ]; then
  echo "tests skipped that must run here:"
  printf '  %s\n' "$unexpected"
  status=1
fi
exit $status
