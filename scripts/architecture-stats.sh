#!/usr/bin/env bash
# How the code is shaped, counted (issue 26's table): where one operation is written, error
# names compared as strings, files over 800 lines. Prints one line per figure.
#
#   scripts/architecture-stats.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Rust sources of the services, without the tests' own files.
sources() {
  find services -name '*.rs' -not -path '*/tests/*' -not -name 'tests.rs' | sort
}

# The files (besides proto/) that mention a relay operation by its Rust name: its method
# (snake_case) or its unit (CamelCase, services/relay/src/ops/operation.rs). The store's methods
# share some names and are not the operation.
operation_files() {
  local name=$1 unit=$2
  grep -l -w -e "$name" -e "$unit" $(sources) | grep -v '^services/relay/src/store/' || true
}

for operation in end_session:EndSession register_manifest:RegisterManifest; do
  files=$(operation_files "${operation%%:*}" "${operation##*:}")
  printf 'files naming the operation %-18s %s  (%s)\n' "${operation%%:*}:" \
    "$(wc -w <<<"$files")" "$(tr '\n' ' ' <<<"$files" | sed 's/ $//')"
done

# Error names compared as strings: a SCREAMING_CASE or snake_case code in quotes next to ==,
# != or a match arm, and matches on message text (HTTP methods and the tests' asserts aside).
compared=$(grep -n -E \
  -e '(==|!=) *"[A-Z][A-Z0-9_]{3,}"' -e '"[A-Z][A-Z0-9_]{3,}" *(==|!=)' \
  -e '^\s*"[A-Z][A-Z0-9_]{3,}"( *\| *"[A-Z][A-Z0-9_]{3,}")* *=>' \
  -e '\.contains\("[a-z ]+limit' -e 'code *== *"[a-z_]+"' \
  $(sources) | grep -v -e 'method *==' -e 'assert' || true)
printf 'error names compared as strings           %s\n' "$(grep -c . <<<"$compared" || true)"
[[ -z $compared ]] || sed 's/^/    /' <<<"$compared"

long=$(for file in $(sources); do
  lines=$(wc -l <"$file")
  ((lines > 800)) && echo "$file $lines"
done || true)
printf 'source files over 800 lines               %s\n' "$(grep -c . <<<"$long" || true)"
[[ -z $long ]] || sed 's/^/    /' <<<"$long"

long_suites=$(for file in tests/tests/*.rs; do
  lines=$(wc -l <"$file")
  ((lines > 800)) && echo "$file $lines"
done || true)
printf 'test suites over 800 lines                %s\n' "$(grep -c . <<<"$long_suites" || true)"
[[ -z $long_suites ]] || sed 's/^/    /' <<<"$long_suites"

# Tests written in tests/tests (a split must keep every one): test attributes, and the store
# conformance cases (`async fn …(fixture)` inside `conformance!`, each run against every store;
# the macro itself, with its four attributes, is in tests/src/store_fixture.rs).
attributes=$(cat tests/tests/*.rs | grep -c -E '^\s*#\[(tokio::)?test' || true)
cases=$(cat tests/tests/*.rs | grep -c -E '^    async fn [a-z_0-9]+\(fixture\)' || true)
printf 'tests in tests/tests                      %s  (%s test functions, %s store conformance cases)\n' \
  "$((attributes + cases))" "$attributes" "$cases"

# Checks a unit writes by hand instead of declaring them (`Operation::CHECKS`, applied by
# `operation::run`): budgets admitted and the guard called in services/relay/src/ops/.
by_hand=$(grep -n -E '\.admit(_session|_tool_call)?\(|\.guarded(_provider)?\(' services/relay/src/ops/*.rs |
  grep -v '^services/relay/src/ops/operation.rs:' || true)
printf 'checks written by hand in units          %s\n' "$(grep -c . <<<"$by_hand" || true)"
[[ -z $by_hand ]] || sed 's/^/    /' <<<"$by_hand"

# What the domain imports of the wire (tonic, protobuf, the gRPC client): none.
domain=$(find services/relay/src/domain -name '*.rs' | sort)
wire=$(grep -l -E 'tonic|prost|toolrelay::proto|RemoteRelay' $domain || true)
printf 'domain files naming wire code             %s of %s\n' "$(grep -c . <<<"$wire" || true)" \
  "$(wc -l <<<"$domain")"
[[ -z $wire ]] || sed 's/^/    /' <<<"$wire"

# Relay modules a front end names (the gateway, its binary aside): only `front`.
named=$(grep -rhoE 'toolrelay_relay::[A-Za-z_]+' services/gateway/src --include='*.rs' --exclude-dir=bin |
  sort -u | sed 's/toolrelay_relay:://')
printf 'relay modules the gateway names           %s  (%s)\n' "$(grep -c . <<<"$named" || true)" \
  "$(tr '\n' ' ' <<<"$named" | sed 's/ $//')"

# Ways to serve the gateway: public async functions of its server module.
entries=$(grep -c -E '^pub async fn' services/gateway/src/server.rs || true)
printf 'ways to serve the gateway                 %s\n' "$entries"

# What adding a store method takes: the places that write one, `touch_mcp_session` say, in the
# store, its wrappers, the metrics and the relay's tests (its callers aside): its entry in the
# list services/relay/src/store/traits.rs declares it, and the two stores implement it.
written=$(grep -rn -w -e touch_mcp_session -e TouchMcpSession services/relay/src/store \
  services/relay/src/process/metrics services/relay/tests | grep -v -E '\.touch_mcp_session\(' || true)
printf 'places that write a store method          %s\n' "$(grep -c . <<<"$written" || true)"
[[ -z $written ]] || sed 's/^/    /' <<<"$written" | cut -c1-120

# The length of function `name` in `file`: from its `fn` line to the brace that closes it at
# the same indentation.
fn_lines() {
  local file=$1 name=$2
  awk -v name="$name" '
    !start && $0 ~ ("fn " name "[<(]") { start = NR; match($0, /^ */); indent = RLENGTH; next }
    start && $0 ~ ("^" sprintf("%" indent "s", "") "}$") { print NR - start + 1; exit }
  ' "$file"
}

# The longest functions on a call's path (issue 42's table: 60 lines at most).
for path in services/relay/src/domain/relay/calls.rs:try_queue \
  services/relay/src/transport/ws/mod.rs:relay_frames \
  services/relay/src/domain/provider/mod.rs:serve \
  services/relay/src/domain/provider/mod.rs:perform \
  services/relay/src/domain/provider/mod.rs:ask; do
  printf 'lines of %-48s %s\n' "${path#services/relay/src/}" "$(fn_lines "${path%%:*}" "${path##*:}")"
done

# Where a delivered call is tracked: the one record type (`Delivered`, each call with its hold),
# kept by a connection's core and, in a split gateway, by its link to the relay (its own drain).
tracked=$(grep -rn -E 'Delivered<|Delivered::<|HashMap<String, Hold>' services --include='*.rs' |
  grep -v -e '/delivered.rs:' -e '/tests/' -e 'mod tests' || true)
printf 'places that track a delivered call        %s\n' "$(grep -c . <<<"$tracked" || true)"
[[ -z $tracked ]] || sed 's/^/    /' <<<"$tracked" | cut -c1-140

# How a caller waits for an answer: the `Call` unit (then `AwaitResponse`), for HTTP and MCP
# alike. MCP queueing with `Submit` and waiting in a loop of its own would be a second way.
own=$(grep -rn -w 'Submit' services/gateway/src/mcp --include='*.rs' || true)
printf 'ways an answer is waited for              %s  (the Call unit%s)\n' \
  "$((1 + $(grep -c . <<<"$own" || true)))" "${own:+, and a loop of MCP}"
