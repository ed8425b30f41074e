#!/usr/bin/env bash
# Seed the fuzz corpora from the example repository (fuzz/corpus is
# gitignored; rerun after the examples change). Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
corpus="$here/corpus"
mkdir -p "$corpus/yaml" "$corpus/site_file" "$corpus/repo"

# yaml and site_file: every example file on its own.
for f in "$root"/cluster.yaml "$root"/sites/*.yaml "$root"/zones/*.yaml "$root"/nodes/*.yaml; do
    name="$(basename "$(dirname "$f")")-$(basename "$f")"
    [ "$f" = "$root/cluster.yaml" ] && name="cluster.yaml"
    cp "$f" "$corpus/yaml/$name"
    cp "$f" "$corpus/site_file/$name"
done

# repo: the whole example repository in the `repo` target's scheme (a line
# `#@c`, `#@s`, `#@z` or `#@n` starts a cluster, site, zone or node file),
# and a smaller valid one per kind removed, so mutations reach compile.
emit() { # kind-letter file
    printf '#@%s %s\n' "$1" "${2#"$root"/}"
    cat "$2"
    # a file that does not end in a newline would swallow the next header
    [ -z "$(tail -c1 "$2")" ] || printf '\n'
}
whole() { # kinds to leave out, e.g. "z"
    local skip="${1:-}"
    [[ $skip == *c* ]] || emit c "$root/cluster.yaml"
    [[ $skip == *s* ]] || for f in "$root"/sites/*.yaml; do emit s "$f"; done
    [[ $skip == *z* ]] || for f in "$root"/zones/*.yaml; do emit z "$f"; done
    [[ $skip == *n* ]] || for f in "$root"/nodes/*.yaml; do emit n "$f"; done
}
whole > "$corpus/repo/example-repo"
whole s > "$corpus/repo/example-no-sites"
whole c > "$corpus/repo/example-no-cluster"
# One site, one zone and its edge: small, valid, fast to mutate.
{
    emit c "$root/cluster.yaml"
    emit s "$root/sites/example.com.yaml"
    emit z "$root/zones/eu.yaml"
    emit z "$root/zones/us.yaml"
    emit n "$root/nodes/edge-ams-1.yaml"
} > "$corpus/repo/small"
echo "seeded: $(ls "$corpus/yaml" | wc -l) yaml, $(ls "$corpus/site_file" | wc -l) site_file, $(ls "$corpus/repo" | wc -l) repo"
