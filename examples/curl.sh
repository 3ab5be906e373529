#!/usr/bin/env bash
# Stream a chat completion with curl. Start a server first: make serve
set -euo pipefail
BASE_URL="${1:-http://127.0.0.1:8000}"
curl -sS -N "$BASE_URL/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model": "demo:tiny", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16, "stream": true}'
