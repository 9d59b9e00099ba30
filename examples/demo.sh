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
echo "# bad input gets one line on stderr and its own exit status"
set +e
fencelog consume no-such-topic
echo "exit status: $? (UNKNOWN_TOPIC)"
fencelog produce orders --partition 9 --value x
echo "exit status: $? (UNKNOWN_PARTITION)"
set -e
echo
echo "demo finished"
