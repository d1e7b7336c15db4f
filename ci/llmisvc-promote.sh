#!/usr/bin/env bash
# Template: promote an LLMInferenceService routing-group member only after kvgate passed.
# The new member ($MEMBER) sits at weight 0 in its group; kvgate gates it through its own endpoint
# (--isvc finds it, docs/launchers.md "KServe pre-canary"); only on exit 0 is its weight raised.
#   ci/llmisvc-promote.sh llama-v2 models 10
set -euo pipefail
MEMBER=${1:?member name}; NS=${2:?namespace}; WEIGHT=${3:-10}; PROFILE=${PROFILE:-kserve-vllm-4k}
.venv/bin/pytest --profile "$PROFILE" --isvc "$MEMBER" --namespace "$NS" --gate-mode certify -m "not load and not soak"
kubectl -n "$NS" patch llminferenceservice "$MEMBER" --type merge \
  -p "{\"spec\":{\"router\":{\"route\":{\"weight\":$WEIGHT}}}}"
echo "promoted $NS/$MEMBER to weight $WEIGHT"
