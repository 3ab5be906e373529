#!/usr/bin/env bash
# Stream a chat completion with curl. Start a server first: make serve
# Usage: examples/curl.sh [BASE_URL [MODEL]]   (MODEL: default demo:smollm2, the demo server's)
set -euo pipefail
BASE_URL="${1:-http://127.0.0.1:8000}"
MODEL="${2:-demo:smollm2}"
curl -sS -N "$BASE_URL/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "'"$MODEL"'", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16, "temperature": 0, "stream": true}'
