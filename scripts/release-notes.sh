#!/usr/bin/env bash
# Prints the release notes of one version: the body of its section in CHANGELOG.md (Keep a
# Changelog: a heading `## [VERSION] - YYYY-MM-DD`), up to the next `## [` heading, without the
# heading itself, the link reference definitions (`[0.10.0]: https://...`) that close the file, and
# leading and trailing blank lines. The release workflow
# (.github/workflows/release.yaml) makes the GitHub release's notes from it; docs/release.md.
#
# Usage: scripts/release-notes.sh VERSION [CHANGELOG]   (VERSION without the tag's "v", e.g. 0.10.0;
#                                                        CHANGELOG defaults to <repo>/CHANGELOG.md)
# Exit 1, naming the file and the heading it looked for, when the section is missing or empty.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: scripts/release-notes.sh VERSION [CHANGELOG]" >&2
  exit 2
fi
version=$1
changelog=${2:-$(cd "$(dirname "$0")/.." && pwd)/CHANGELOG.md}
[ -f "$changelog" ] || { echo "release-notes: $changelog does not exist" >&2; exit 1; }

# The section's heading must carry the release date (an "Unreleased" section is not a release).
if ! grep -Eq "^## \[$version\] - [0-9]{4}-[0-9]{2}-[0-9]{2}\b" "$changelog"; then
  echo "release-notes: $changelog has no heading \"## [$version] - YYYY-MM-DD\" (still Unreleased?)" >&2
  exit 1
fi

notes=$(awk -v heading="## [$version]" '
  index($0, heading) == 1 && (length($0) == length(heading) || substr($0, length(heading) + 1, 1) == " ") { on = 1; next }
  on && /^## \[/ { exit }
  on && /^\[[^]]+\]: / { next }
  on { print }
' "$changelog" | sed -e '/./,$!d' | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}')

if [ -z "${notes//[[:space:]]/}" ]; then
  echo "release-notes: $changelog has no section \"## [$version] - <date>\", or it is empty" >&2
  exit 1
fi
printf '%s\n' "$notes"
