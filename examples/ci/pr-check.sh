#!/bin/sh
# edgeform's pull-request check for any CI system: validate, diff against
# the base branch as a markdown comment, and (optionally) post that comment,
# updating the previous one in place (found by its marker line).
#
#   EDGEFORM         the edgeform binary            (default: edgeform)
#   EDGEFORM_REPO    the config repository folder   (default: .)
#   EDGEFORM_BASE    the base revision              (default: origin/main)
#   EDGEFORM_OUT     where the comment is written   (default: edgeform-diff.md)
#   EDGEFORM_POST    how to post it: none | github | gitlab   (default: none)
#       github: needs `gh` (GH_TOKEN) and PR_NUMBER
#       gitlab: needs curl, jq, GITLAB_TOKEN, CI_API_V4_URL, CI_PROJECT_ID,
#               CI_MERGE_REQUEST_IID (all but the token are set by GitLab CI)
#
# Exit: 0 valid (changes or not), 1 invalid or an error.
set -eu

EDGEFORM=${EDGEFORM:-edgeform}
REPO=${EDGEFORM_REPO:-.}
BASE=${EDGEFORM_BASE:-origin/main}
OUT=${EDGEFORM_OUT:-edgeform-diff.md}
POST=${EDGEFORM_POST:-none}
MARKER='<!-- edgeform-diff -->'

echo "== edgeform check ($REPO)"
"$EDGEFORM" --repo "$REPO" check

echo "== edgeform diff --base $BASE"
set +e
"$EDGEFORM" --repo "$REPO" diff --base "$BASE" --format markdown > "$OUT"
code=$?
set -e
case $code in
  0) echo "no edge receives a change" ;;
  2) echo "changes: see $OUT" ;;
  *) echo "edgeform diff failed (exit $code)" >&2; exit 1 ;;
esac

case $POST in
  none) ;;
  github)
    : "${PR_NUMBER:?PR_NUMBER is required for EDGEFORM_POST=github}"
    id=$(gh api "repos/{owner}/{repo}/issues/$PR_NUMBER/comments" --paginate \
         --jq ".[] | select(.body | startswith(\"$MARKER\")) | .id" | head -n 1)
    if [ -n "$id" ]; then
      gh api -X PATCH "repos/{owner}/{repo}/issues/comments/$id" -F "body=@$OUT" > /dev/null
      echo "updated comment $id"
    else
      gh pr comment "$PR_NUMBER" --body-file "$OUT"
    fi
    ;;
  gitlab)
    : "${GITLAB_TOKEN:?GITLAB_TOKEN is required for EDGEFORM_POST=gitlab}"
    api="$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests/$CI_MERGE_REQUEST_IID/notes"
    id=$(curl -fsS -H "PRIVATE-TOKEN: $GITLAB_TOKEN" "$api?per_page=100" |
         jq -r --arg m "$MARKER" '[.[] | select(.body | startswith($m)) | .id][0] // empty')
    body=$(jq -Rs '{body: .}' < "$OUT")
    if [ -n "$id" ]; then
      curl -fsS -X PUT -H "PRIVATE-TOKEN: $GITLAB_TOKEN" -H 'Content-Type: application/json' \
           -d "$body" "$api/$id" > /dev/null
      echo "updated note $id"
    else
      curl -fsS -X POST -H "PRIVATE-TOKEN: $GITLAB_TOKEN" -H 'Content-Type: application/json' \
           -d "$body" "$api" > /dev/null
      echo "posted a note"
    fi
    ;;
  *) echo "EDGEFORM_POST must be none, github or gitlab" >&2; exit 1 ;;
esac
