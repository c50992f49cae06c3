#!/usr/bin/env bash
# check-docs-history.sh - the docs and the comments describe the product as
# it is: no issue numbers, no work sessions, no "the issue's figures". Every
# text file of the tree (docs, sources and their comments, tests, scripts,
# bench, configurations) is searched for the phrases that tell the history
# of the work instead; each hit is printed as FILE:LINE: TEXT and the check
# fails. A figure belongs with the command that reproduces it, not with the
# piece of work that measured it.
#
#   scripts/check-docs-history.sh [ROOT]      check the tree at ROOT (default: this checkout)
#   scripts/check-docs-history.sh --self-test plant each kind of phrase in a scratch tree and
#                                             require the check to fail on it, and pass without
#
# Run by `make test` (ctest: docs_history_check, docs_history_selftest).
set -u

# Extended regular expressions, matched case-insensitively.
PATTERNS=(
    '\bissues? ?#?[0-9]+'                      # issue 7, issues 6, issue #12
    '\bsessions? ?#?[0-9]+'                    # session 5
    '\b(the|this|that|an|later|earlier|previous|next|foundation|same|other) issue\b'
    "\\bissue('s| note)"                       # the issue's figures, the issue note
    '\b(the|this|that|earlier|previous|next|other|same) sessions?\b( that| which| note|s that)'
    '\bsession note'
    '\bacceptance #?[0-9]+'                    # acceptance 3
    "\\bacceptance points?\\b"
)

# What is not ours to word, or not text: build trees, recorded data,
# fuzz corpora, third-party packages, this script itself.
check_tree() {
    local root=$1 hits=0 pattern
    for pattern in "${PATTERNS[@]}"; do
        if grep -rniIE "$pattern" "$root" \
            --exclude-dir=.git --exclude-dir='build*' --exclude-dir=node_modules \
            --exclude-dir=data --exclude-dir='corpus*' \
            --exclude=check-docs-history.sh --exclude='*.gguf' --exclude=package-lock.json; then
            hits=1
        fi
    done
    return $hits
}

if [ "${1:-}" = "--self-test" ]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    mkdir -p "$scratch/docs" "$scratch/src"
    printf '# Router\n\nThe router answers every request (make bench-router).\n' \
        >"$scratch/docs/router.md"
    printf '/* router.c - the router: it issues one request per attempt. */\n' \
        >"$scratch/src/router.c"
    if ! check_tree "$scratch" >/dev/null; then
        echo "self-test: the check fails on a clean tree"
        exit 1
    fi
    planted=(
        "Router additions (issue 7: ledger, jobs, tools)"
        "the figures of issue 15."
        "after the per-request costs were cut (session 5: fewer system calls)"
        "its output is in the session note that landed it"
        "measured at the end of the session that rebuilt the scheduler"
        "the reference figures of the foundation issue"
        "before (the issue's figures)"
        "(issue 19, acceptance 3)"
    )
    for text in "${planted[@]}"; do
        cp "$scratch/docs/router.md" "$scratch/docs/router.md.orig"
        printf '%s\n' "$text" >>"$scratch/docs/router.md"
        if check_tree "$scratch" >/dev/null; then
            echo "self-test: the check passes with '$text' in the docs"
            exit 1
        fi
        mv "$scratch/docs/router.md.orig" "$scratch/docs/router.md"
    done
    echo "self-test: the check fails on each of ${#planted[@]} planted phrases and passes without them"
    exit 0
fi

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if check_tree "$root"; then
    echo "docs history check: no issue or session named in $root"
    exit 0
fi
echo "docs history check: the lines above tell the history of the work; describe the product"
echo "as it is (a figure with the command that reproduces it)"
exit 1
