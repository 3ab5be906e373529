"""OpenAI's chat and text completions: request bodies, their translation, and the responses."""
