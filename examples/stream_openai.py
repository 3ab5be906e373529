"""Stream a chat completion with the official openai client.

Start a server first (`make serve`), then:

    python examples/stream_openai.py [BASE_URL]
"""

from __future__ import annotations

import sys

from openai import OpenAI


def main(base_url: str = "http://127.0.0.1:8000/v1") -> str:
    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name 3 colors."}],
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            print(f"\n[{chunk.usage.completion_tokens} completion tokens]")
    client.close()
    return "".join(pieces)


if __name__ == "__main__":
    main(*sys.argv[1:2])
