#!/usr/bin/env bash
# The rooms' include table (docs/internals/rooms.md) against the code.
#
#   scripts/check-rooms.sh [SRC_DIR [TABLE]]
#       every #include "ROOM/..." in SRC_DIR (default src/) must name the
#       file's own room or one its row allows; every directory of SRC_DIR
#       must be a room of the table; no include may climb out with "../".
#       Prints each violation as FILE:LINE and exits 1 when there is one.
#   scripts/check-rooms.sh --self-test BUILD_DIR CC
#       shows that both guards work: the check, on a copy of src/ with an
#       include of the router planted in the engine, must fail and name it;
#       and the compiler, given the engine room's include path from
#       BUILD_DIR/rooms/engine, must refuse that include and accept one of
#       the engine's own headers.
# Run by `make test` (CTest: rooms_include_check, rooms_guard_selftest).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

check() {
  local src=$1 table=$2
  awk -v src="$src" '
    FNR == NR {
      # a table row: | `room` | `dep` `dep` | what it owns |
      if ($0 ~ /^\| `[a-z]+` \|/) {
        split($0, col, "|")
        room = col[2]; gsub(/[ `]/, "", room)
        rooms[room] = 1
        allowed[room, room] = 1
        n = split(col[3], deps, /[^a-z]+/)
        for (i = 1; i <= n; i++) if (deps[i] != "") allowed[room, deps[i]] = 1
      }
      next
    }
    {
      file = FILENAME
      rel = substr(file, length(src) + 2)
      room = rel; sub(/\/.*/, "", room)
      if (!(room in rooms)) {
        if (!(room in told)) {
          printf "%s: the directory src/%s is not a room of docs/internals/rooms.md\n", file, room
          told[room] = 1; bad = 1
        }
        next
      }
      if ($0 ~ /^[ \t]*#[ \t]*include[ \t]*"/) {
        inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
        if (inc ~ /(^|\/)\.\.\//) {
          printf "%s:%d: #include \"%s\" climbs out of the room\n", file, FNR, inc
          bad = 1
        } else if (inc ~ /\//) {
          target = inc; sub(/\/.*/, "", target)
          if ((target in rooms) && !((room, target) in allowed)) {
            printf "%s:%d: room %s includes %s (\"%s\"), which docs/internals/rooms.md does not allow it\n", file, FNR, room, target, inc
            bad = 1
          }
        }
      }
    }
    END { exit bad }
  ' "$table" $(find "$src" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | sort)
}

if [ "${1:-}" = "--self-test" ]; then
  build=${2:?usage: check-rooms.sh --self-test BUILD_DIR CC}
  cc=${3:?usage: check-rooms.sh --self-test BUILD_DIR CC}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r "$here/src" "$work/src"
  check "$work/src" "$here/docs/internals/rooms.md" >/dev/null ||
    { echo "self-test: the check fails on the untouched tree" >&2; exit 1; }
  printf '#include "router/router.h"\n' >> "$work/src/engine/sampler.c"
  if out=$(check "$work/src" "$here/docs/internals/rooms.md"); then
    echo "self-test: the check passed a planted include of the router in the engine" >&2; exit 1
  fi
  grep -q 'src/engine/sampler.c:[0-9]*: room engine includes router' <<<"$out" ||
    { echo "self-test: the check failed without naming the planted include: $out" >&2; exit 1; }
  mkdir "$work/src/stray"
  printf 'int x;\n' > "$work/src/stray/x.c"
  out=$(check "$work/src" "$here/docs/internals/rooms.md") && exit 1
  grep -q 'src/stray is not a room' <<<"$out" ||
    { echo "self-test: a directory outside the table went unnoticed" >&2; exit 1; }
  inc="$build/rooms/engine"
  [ -d "$inc" ] || { echo "self-test: no $inc (configure the build first)" >&2; exit 1; }
  printf '#include "engine/sampler.h"\nint ok;\n' > "$work/down.c"
  "$cc" -fsyntax-only -I"$inc" "$work/down.c" ||
    { echo "self-test: the engine room cannot include its own header" >&2; exit 1; }
  printf '#include "router/router.h"\nint bad;\n' > "$work/up.c"
  if "$cc" -fsyntax-only -I"$inc" "$work/up.c" 2>"$work/up.err"; then
    echo "self-test: the engine room's include path reaches the router" >&2; exit 1
  fi
  grep -q 'router/router.h' "$work/up.err" ||
    { echo "self-test: the compiler failed for another reason:" >&2; cat "$work/up.err" >&2; exit 1; }
  echo "rooms: the check and the build both refuse an include of a room above"
  exit 0
fi

src=${1:-$here/src}
table=${2:-$here/docs/internals/rooms.md}
if check "$src" "$table"; then
  echo "rooms: every include in $(basename "$src")/ is one docs/internals/rooms.md allows"
else
  exit 1
fi
