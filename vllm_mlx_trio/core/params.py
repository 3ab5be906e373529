"""Per-request sampling parameters: one frozen record, validated once at the boundary."""

from __future__ import annotations

import math

import attrs

from ..errors import InvalidRequestError
from .constraint import CompiledGrammar, ConstraintSpec
from .thinking_budget import ThinkingBudget

#: Largest ``n``-free limits we accept; beyond these a request is refused, never clamped.
MAX_TOP_K = 1_000_000
MAX_SEED = 2**63 - 1
#: OpenAI's limits: penalties in [-2, 2], logit_bias values in [-100, 100], top_logprobs <= 20.
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
MAX_TOP_LOGPROBS = 20


@attrs.frozen(slots=True, kw_only=True)
class SamplingParams:
    """What a request asks of the sampler and of the stop logic.

    ``max_tokens`` is ``None`` until admission resolves it against the model's context; every
    value the executor sees is an int. ``temperature == 0`` means greedy.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    #: OpenAI penalties over the tokens generated so far (not the prompt).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: (token id, bias) pairs added to the logits before sampling.
    logit_bias: tuple[tuple[int, float], ...] = ()
    #: EOS and stop token ids cannot be sampled before this many tokens.
    min_tokens: int = 0
    #: Keep generating past EOS (stop_token_ids still stop).
    ignore_eos: bool = False
    #: None: no logprobs; k >= 0: the sampled token's logprob and the k most likely.
    logprobs: int | None = None
    #: Tokens per streamed chunk after the first; None means ``engine.stream_interval``.
    stream_interval: int | None = None
    #: Prefix-cache isolation: only requests with the same salt share cached blocks.
    cache_salt: str | None = None
    #: The named LoRA adapter the request runs with (``[model] adapters``; the request's model
    #: was ``<served name>:<adapter>``); None: the base. A cache key: its KV is the adapter's.
    adapter: str | None = None
    #: What the output must match (JSON schema, regex, forced tool calls...); not a cache key:
    #: a constraint changes which tokens are sampled, never the KV of a prefix.
    constraint: ConstraintSpec | None = None
    #: ``constraint`` compiled for this model: set by admission (off the event loop), used by
    #: the MLX thread; opaque here (``structured.CompiledConstraint``).
    grammar: CompiledGrammar | None = attrs.field(default=None, eq=False, repr=False)
    # vLLM's extension fields (http/openai/extensions.py): output text, prompt rendering, queue order.
    #: Keep a matched stop string at the end of the text (vLLM's ``include_stop_str_in_output``).
    include_stop_str_in_output: bool = False
    #: Drop special tokens from the text (False: ``<|im_end|>`` and the like appear as text).
    skip_special_tokens: bool = True
    #: Chat prompts: end the rendered prompt with the assistant's opening (the template's own).
    add_generation_prompt: bool = True
    #: Chat prompts: leave the last (assistant) turn open so the model continues it.
    continue_final_message: bool = False
    #: Waiting order: lower first, first come first served within one priority (vLLM's rule).
    priority: int = 0
    #: At most this many tokens inside the thinking block, then its end marker is forced
    #: (Anthropic's ``thinking.budget_tokens``); admission sets whether the prompt opened it.
    thinking_budget: ThinkingBudget | None = None

    @property
    def cache_keys(self) -> tuple:
        """Extra keys of this request's prefix-cache blocks (its salt and its adapter, when it has them)."""
        salt = () if self.cache_salt is None else (("cache_salt", self.cache_salt),)
        return salt if self.adapter is None else (*salt, ("adapter", self.adapter))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def check(self, *, max_stop_sequences: int) -> None:
        """Raise :class:`InvalidRequestError` naming the first out-of-range field."""
        _check_range("temperature", self.temperature, 0.0, 2.0)
        _check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_range("top_k", self.top_k, 0, MAX_TOP_K)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, 10.0, low_open=True)
        if self.seed is not None:
            _check_range("seed", self.seed, -MAX_SEED - 1, MAX_SEED)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {self.max_tokens}.", param="max_tokens")
        if len(self.stop) > max_stop_sequences:
            raise InvalidRequestError(
                f"At most {max_stop_sequences} stop sequences are allowed, got {len(self.stop)}.",
                param="stop",
            )
        if any(s == "" for s in self.stop):
            raise InvalidRequestError("Stop sequences must not be empty.", param="stop")
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be non-negative.", param="stop_token_ids")
        _check_range("presence_penalty", self.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
        _check_range("frequency_penalty", self.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)
        for token_id, bias in self.logit_bias:
            if token_id < 0:
                raise InvalidRequestError("logit_bias keys must be token ids >= 0.", param="logit_bias")
            _check_range("logit_bias", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
        _check_range("min_tokens", self.min_tokens, 0, self.max_tokens or MAX_SEED)
        if self.logprobs is not None:
            _check_range("top_logprobs", self.logprobs, 0, MAX_TOP_LOGPROBS)
        if self.stream_interval is not None:
            _check_range("stream_interval", self.stream_interval, 1, MAX_TOP_K)
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequestError(
                "add_generation_prompt and continue_final_message cannot both be true.",
                param="continue_final_message",
            )
        _check_range("priority", self.priority, -MAX_SEED - 1, MAX_SEED)
        if self.cache_salt is not None and not self.cache_salt:
            raise InvalidRequestError("cache_salt must not be empty.", param="cache_salt")

    def check_token_ids(self, vocab_size: int) -> None:
        """Token ids the request names must exist in the model's vocabulary."""
        for name, ids in (
            ("stop_token_ids", self.stop_token_ids),
            ("logit_bias", tuple(t for t, _ in self.logit_bias)),
        ):
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"{name} names token id {bad}, outside the vocabulary (size {vocab_size}).",
                    param=name,
                )

    def stop_ids(self, eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
        """Token ids that end this request: EOS (unless ``ignore_eos``) and stop_token_ids."""
        eos = () if self.ignore_eos else eos_token_ids
        return tuple(sorted(set(eos) | set(self.stop_token_ids)))


def _check_range(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value}.", param=name)
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        bracket = "(" if low_open else "["
        raise InvalidRequestError(f"{name} must be in {bracket}{low}, {high}], got {value}.", param=name)
