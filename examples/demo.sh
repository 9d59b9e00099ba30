#!/usr/bin/env bash
# A short guided tour of fencelog on the embedded default (./.fencelog), run by `make demo`.
# It works in a scratch directory so it can run again and again, and removes it at the end.
set -euo pipefail

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

echo "fencelog demo in $scratch (data directory: ./.fencelog)"
step fencelog topic create orders --partitions 4
step fencelog topic list --json

printf '\n\033[1m$ printf "a\\nb\\nc\\n" | fencelog produce orders --key k1\033[0m\n'
printf 'a\nb\nc\n' | fencelog produce orders --key k1

step fencelog produce orders --partition 2 --value hello --header trace=abc --json
step fencelog consume orders --partition 2 --from 0 --max 10 --json
step fencelog consume orders --from beginning

echo
echo "# a follower in the background wakes on each new record"
fencelog consume orders --from end --follow --timeout 2s --json &
follower=$!
sleep 0.5
fencelog produce orders --value live-1 --value live-2 >/dev/null
wait "$follower"

printf '\n\033[1m$ printf "\\x00\\xff" | base64 | fencelog produce orders -p 0 --format base64\033[0m\n'
printf '\x00\xff' | base64 | fencelog produce orders -p 0 --format base64
step fencelog consume orders -p 0 --format hex --json

step fencelog status --json

echo
echo "# idempotent producers: a retry is answered with the original offset"
lease=$(fencelog lease-pid orders 1 --json)
pid=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pid"])' "$lease")
gen=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["generation"])' "$lease")
step fencelog produce orders --partition 1 --pid "$pid" --generation "$gen" --sequence 1 --value once --json
step fencelog produce orders --partition 1 --pid "$pid" --generation "$gen" --sequence 1 --value once --json
printf '\n\033[1m$ seq 1 1000 | fencelog produce orders --idempotent\033[0m\n'
seq 1 1000 | fencelog produce orders --idempotent

echo
echo "# ownership: writes to an owner-group topic need the current owner's fence"
step fencelog topic create journal --partitions 2 --owner-group samza
step fencelog own samza journal/0 --generation 3 -- fencelog produce journal --partition 0 --value from-the-owner --json
set +e
fencelog produce journal --partition 0 --fence samza:journal/0:3 --value zombie
echo "exit status: $? (FENCED: the claim ended with its command)"
set -e
step fencelog own history --json

echo
echo "# exclusive producers: one writer at a time, one segment per epoch"
step fencelog topic create control
{ echo from-leader-1; sleep 2; } | fencelog produce control --access exclusive --producer-name leader-1 &
holder=$!
sleep 1
set +e
fencelog produce control --access shared --value y
echo "exit status: $? (PRODUCER_BUSY while leader-1 holds the topic)"
set -e
echo "# leader-2 waits for exclusive access, and gets it once leader-1 ends"
echo "k=v" | fencelog produce control --access wait-exclusive --wait-timeout 10s --key-separator = --producer-name leader-2
wait "$holder"
step fencelog consume control --compacted --json

echo
echo "# transactions: all or nothing across topics, spread over several commands"
step fencelog topic create invoices
step fencelog topic create ledger --partitions 4
txn=$(fencelog txn-begin --group billing --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["txn_id"])')
echo "transaction $txn"
step fencelog produce invoices --txn "$txn" --value inv-1
step fencelog produce ledger --txn "$txn" --partition 3 --value debit-1
step fencelog consume invoices --from beginning --json
echo "(nothing yet: the transaction is open)"
step fencelog txn list
step fencelog txn-commit "$txn" --json
step fencelog consume invoices --from beginning --json
other=$(fencelog txn-begin --group billing --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["txn_id"])')
fencelog produce invoices --txn "$other" --value never-seen >/dev/null
step fencelog txn-abort "$other"
set +e
printf '\n\033[1m$ fencelog txn-commit %s   # too late: it was aborted\033[0m\n' "$other"
fencelog txn-commit "$other"
echo "exit status: $? (TXN_ABORTED)"
set -e

echo
echo "# the same commands against a server"
fencelog serve --listen 127.0.0.1:0 --ready-file ready.json >/dev/null &
server=$!
for _ in $(seq 50); do [ -s ready.json ] && break; sleep 0.1; done
url="tcp://$(python3 -c 'import json; print(json.load(open("ready.json"))["tcp"])')"
step fencelog --broker "$url" produce orders --value served --json
step fencelog --broker "$url" consume orders --partition 0 --from 0 --max 2 --json
kill -TERM "$server"
wait "$server"

echo
echo "# bad input gets one line on stderr and its own exit status"
set +e
fencelog consume no-such-topic
echo "exit status: $? (UNKNOWN_TOPIC)"
fencelog produce orders --partition 9 --value x
echo "exit status: $? (UNKNOWN_PARTITION)"
set -e
echo
if [ "${FENCELOG_DEMO_SPARK:-1}" = 1 ] && command -v java >/dev/null; then
    echo "# the data pipeline on Spark: clicks -> upper case -> clicks_upper, exactly once"
    echo "# (each micro-batch one fencelog transaction; FENCELOG_DEMO_SPARK=0 skips this)"
    pipeline=(python "$OLDPWD/examples/spark_pipeline.py" --broker ./.fencelog
        --input clicks --output clicks_upper --records 5000 --per-trigger 2000
        --checkpoint spark-checkpoint)
    step "${pipeline[@]}"
    printf 'new-1\nnew-2\n' | fencelog produce clicks --partition 0 >/dev/null
    echo "# run again: only the two new records are read and written (the totals count both runs)"
    step "${pipeline[@]}"
fi
echo
echo "demo finished"
